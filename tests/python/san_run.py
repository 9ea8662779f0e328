"""Runs tests/python/run.py in an interpreter that a sanitizer's runtime was
preloaded into (make check-asan, check-tsan: tests/sanitize.mk writes the
wrapper that starts it):

    LD_PRELOAD=libasan.so PF_SAN_CHILD_ASAN_OPTIONS=... \\
        python3 san_run.py run.py test_host.py

The preload is what lets the interpreter dlopen the sanitized libprefetch.so;
it has done its work once the interpreter runs, so it is taken out of the
environment here, before any test starts a process: a compiler or a plain
python3 that a test runs must not run under the sanitizer (its own leaks
would be reported), and the instrumented daemon and prefetchctl load the
runtime themselves.  Each PF_SAN_CHILD_<NAME>=value becomes NAME=value for
those children (the interpreter itself may run with other options, e.g.
LeakSanitizer off).
"""

import os
import runpy
import sys

PREFIX = "PF_SAN_CHILD_"


def main():
    os.environ.pop("LD_PRELOAD", None)
    for key in [k for k in os.environ if k.startswith(PREFIX)]:
        os.environ[key[len(PREFIX):]] = os.environ.pop(key)
    if len(sys.argv) < 2:
        sys.stderr.write("usage: %s RUN_PY [ARGS...]\n" % sys.argv[0])
        return 2
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
