"""What the Python tests share: a real prefetchd on a temporary socket (as
tests/lib/testutil.c's td_start starts one), its status through prefetchctl,
a bystander beside it (tests/lib/bystander.c, run as build/tests/bystander),
and the shuffle's reference implementation (docs/SHUFFLE.md).

Importing this module puts the repository's python/ directory first on
sys.path, so the tests exercise the package of this tree.
"""

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import prefetch  # noqa: E402  (needs the path above)
from prefetch import _lib  # noqa: E402

__all__ = ["ROOT", "Bystander", "Daemon", "prefetch", "shard", "shuffle"]

PREFETCHD = os.environ.get("PREFETCHD_BIN") or os.path.join(ROOT, "build", "prefetchd")
PREFETCHCTL = os.environ.get("PREFETCHCTL_BIN") or os.path.join(ROOT, "build", "prefetchctl")
BYSTANDER = os.environ.get("PF_BYSTANDER_BIN") or os.path.join(ROOT, "build", "tests", "bystander")

_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    # The daemon dies with its test: a crashed test must not leave it
    # running, holding the test's stdout open for a pipe (run.sh's).
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class Daemon:
    """A prefetchd serving `datasets` ({name: {field: path or [shards]}})
    from a temporary directory, with `extra` lines in [daemon] and `env`
    added to its environment.  Use as a context manager or call stop()."""

    def __init__(self, tag, datasets, extra="", env=None, tmpdir=None):
        self.dir = tmpdir or tempfile.mkdtemp(prefix="pf-py%s-" % tag)
        self.own_dir = tmpdir is None
        self.sock = os.path.join(self.dir, "prefetchd-%s.sock" % tag)
        self.conf = os.path.join(self.dir, "prefetchd-%s.conf" % tag)
        self.log = os.path.join(self.dir, "daemon-%s.log" % tag)
        lines = ["[daemon]", "socket = " + self.sock]
        if "readers" not in extra:
            lines.append("readers = 2")
        lines += [line for line in extra.splitlines() if line.strip()]
        for name, fields in datasets.items():
            lines += ["", "[dataset.%s]" % name, "format = npy"]
            for field, path in fields.items():
                paths = path if isinstance(path, (list, tuple)) else [path]
                lines.append("field.%s = %s" % (field, ", ".join(paths)))
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        full_env = dict(os.environ)
        full_env.update(env or {})
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([PREFETCHD, "-v", "-c", self.conf], stdout=log,
                                         stderr=log, env=full_env,
                                         preexec_fn=_die_with_parent)
        self._wait_ready()

    def _wait_ready(self):
        lib = _lib.lib()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("prefetchd exited with %s:\n%s"
                                   % (self.proc.returncode, self.log_tail()))
            client = ctypes.c_void_p()
            rc = lib.pf_connect(self.sock.encode(), ctypes.byref(client))
            lib.pf_close(client)
            if rc == 0:
                return
            time.sleep(0.01)
        self.stop()
        raise RuntimeError("prefetchd did not answer within 10 s:\n" + self.log_tail())

    def log_tail(self, nbytes=4096):
        try:
            with open(self.log, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - nbytes))
                return f.read().decode(errors="replace")
        except OSError as e:
            return "(no log: %s)" % e

    def status(self):
        """`prefetchctl status --json`, parsed."""
        out = subprocess.run([PREFETCHCTL, "-s", self.sock, "status", "--json"],
                             capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise RuntimeError("prefetchctl status: %s" % out.stderr.strip())
        return json.loads(out.stdout)

    def session(self, sid):
        """The status entry of session sid (a dict), or None."""
        for s in self.status()["sessions"]:
            if s["session"] == sid:
                return s
        return None

    def wait_session(self, sid, pred, timeout=5.0):
        """Polls the status of session sid until pred(entry) holds; returns
        the last entry (the caller asserts on it)."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.session(sid)
            if (s is not None and pred(s)) or time.monotonic() >= deadline:
                return s
            time.sleep(0.02)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.own_dir and not os.environ.get("PF_KEEP_TMP"):
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class Bystander:
    """Another client of the daemon at sock while a case runs: the C tests'
    bystander (tests/lib/bystander.c) in a process of its own, running
    shuffled host epochs of `dataset` with every row checked and timing a
    status every 20 ms, until stop().  A process, not a thread of this
    interpreter, so that what it times is the daemon and not the wait for
    the interpreter's lock.  `dataset` is one field of the file that
    write_rows(path) wrote."""

    ROWS, ROW_BYTES, SEED, BATCH = 2048, 64, 33, 32

    @classmethod
    def write_rows(cls, path):
        subprocess.run([BYSTANDER, "write", path, str(cls.ROWS), str(cls.ROW_BYTES),
                        str(cls.SEED)], check=True, timeout=30)

    def __init__(self, sock, dataset):
        self.proc = subprocess.Popen([BYSTANDER, "run", sock, dataset, str(self.BATCH),
                                      str(self.ROW_BYTES), str(self.SEED)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     preexec_fn=_die_with_parent)
        # It prints the line once its connections and session are open
        # (or failed to: stop() reports why), so that it runs before the
        # case does anything.
        line = self.proc.stdout.readline()
        if not line.startswith("bystander: started"):
            self.kill()
            raise RuntimeError("%s did not start: %s%s" % (BYSTANDER, line,
                                                           self.proc.stdout.read()))

    def stop(self):
        """Closes its stdin: it waits for a whole epoch (20 s at most),
        stops and reports.  Returns its exit status (0: every epoch
        byte-exact, every status within 100 ms) and its report."""
        out, _ = self.proc.communicate(timeout=60)
        return self.proc.returncode, out.strip()

    def kill(self):
        """For a case that failed before stop(): harmless after it."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def mixed_arrays(rng, n):
    """n rows of six fields with different dtypes and sample shapes, drawn
    from the numpy Generator rng (tests add their own fields after)."""
    import numpy as np

    return {
        "x": rng.standard_normal((n, 3, 5), dtype=np.float32),
        "y": rng.integers(-2**62, 2**62, size=n, dtype=np.int64),
        "z": rng.integers(0, 256, size=(n, 7), dtype=np.uint8),
        "b": rng.integers(0, 2, size=n).astype(np.bool_),
        "h": rng.standard_normal((n, 2)).astype(np.float16),
        "d": rng.standard_normal((n, 2, 2)),
    }


# The shuffle's reference implementation is the package's own
# (python/prefetch/order.py, checked against the daemon by test_order.py).
from prefetch.order import shuffle, share as shard  # noqa: E402,F401


