"""README.md's quick start, run as written, so that a README that drifts from
the code fails `make check`.

The section is the one headed "## Quick start"; its fenced blocks are taken
in order: ```sh blocks run with sh -e from the top of a copy of the checkout
(a clone's files and build/, with their times, so `make` finds everything
built and the checkout's own run/ is left alone), ```python blocks run
with PYTHONPATH=python (what the text says) under this interpreter, and a
```text block right after a python block is what it must print.  Nothing
is skipped: the quick start is host-only (device "cpu").  The daemon that
`make serve` leaves running is stopped at the end whatever happened.

Run through tests/run.py (make check).
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

import pfutil

BLOCK = re.compile(r"^```(\w+)\n(.*?)^```\s*$", re.S | re.M)
# What of the checkout the copy leaves out: git's data, the checkout's own
# demo and the sanitizer and fuzz builds (none of which the quick start
# uses).
LEFT_OUT = {".git", "run", "build-asan", "build-tsan"}


def quick_start(readme):
    """The quick start's fenced blocks as (language, text) pairs."""
    m = re.search(r"^## Quick start\b.*?$(.*?)(?=^## )", readme, re.S | re.M)
    if not m:
        raise AssertionError("README.md has no '## Quick start' section")
    return [(lang, text) for lang, text in BLOCK.findall(m.group(1))]


def env_for_commands():
    """The make of `make check` around us must not lend its jobserver to the
    makes of the quick start; the rest is the user's environment."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("MAKE", "MFLAGS", "PYTHONPATH", "PREFETCH"))}


class QuickStart(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="pf-readme-")
        self.clone = os.path.join(self.tmp, "prefetchd")

        def ignore(d, names):
            if os.path.abspath(d) == pfutil.ROOT:
                return [n for n in names if n in LEFT_OUT]
            if os.path.abspath(d) == os.path.join(pfutil.ROOT, "build"):
                return [n for n in names if n == "fuzz"]
            return []

        shutil.copytree(pfutil.ROOT, self.clone, symlinks=True, ignore=ignore)
        self.addCleanup(self.cleanup)

    def cleanup(self):
        # Whatever the blocks did: no daemon of the copy's outlives the case.
        subprocess.run(["make", "--no-print-directory", "stop"], cwd=self.clone,
                       env=env_for_commands(), capture_output=True, timeout=60)
        pidfile = os.path.join(self.clone, "run", "prefetchd.pid")
        if os.path.exists(pidfile):
            try:
                os.kill(int(open(pidfile).read()), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        if not os.environ.get("PF_KEEP_TMP"):
            shutil.rmtree(self.tmp, ignore_errors=True)

    def test_quick_start_runs_as_written(self):
        with open(os.path.join(pfutil.ROOT, "README.md")) as f:
            blocks = quick_start(f.read())
        kinds = [lang for lang, _ in blocks]
        self.assertIn("sh", kinds)
        self.assertIn("python", kinds)
        env = env_for_commands()
        last_output = None
        for i, (lang, text) in enumerate(blocks):
            where = "quick start block %d (%s):\n%s" % (i + 1, lang, text)
            if lang == "sh":
                out = subprocess.run(["sh", "-e", "-c", text], cwd=self.clone, env=env,
                                     capture_output=True, text=True, timeout=900)
                print(out.stdout[-2000:])
                self.assertEqual(out.returncode, 0, "%s\nfailed:\n%s%s" % (where, out.stdout,
                                                                           out.stderr))
                last_output = None
            elif lang == "python":
                py_env = dict(env, PYTHONPATH="python")
                out = subprocess.run([sys.executable, "-B", "-"], input=text, cwd=self.clone,
                                     env=py_env, capture_output=True, text=True, timeout=900)
                print(out.stdout)
                self.assertEqual(out.returncode, 0, "%s\nfailed:\n%s%s" % (where, out.stdout,
                                                                           out.stderr))
                last_output = out.stdout
            elif lang == "text":
                self.assertIsNotNone(last_output, "%s\nfollows no python block" % where)
                self.assertEqual(last_output, text, "the python block printed\n%s\nbut the "
                                 "README says\n%s" % (last_output, text))
                last_output = None
            else:
                self.fail("%s\nis of a language this test does not run" % where)
        # The blocks end with the daemon stopped, as the text says.
        self.assertFalse(os.path.exists(os.path.join(self.clone, "run", "prefetchd.pid")))
        self.assertFalse(os.path.exists(os.path.join(self.clone, "run", "prefetchd.sock")))


if __name__ == "__main__":
    unittest.main()
