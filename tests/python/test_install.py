"""Installing: `make install` into a staging tree, the Python package into a
fresh venv with pip, offline, as the README says, and a trainer outside the
source tree that imports it and runs a byte-checked epoch against the
installed prefetchd through the installed libprefetch.

Needs python3-venv and python3-pip (Debian 12: the venv's pip, and the
setuptools and wheel it builds with, come from python3-pip-whl,
python3-setuptools and python3-wheel through --system-site-packages);
the case fails, naming them, when they are missing.  Run through
tests/run.py (make check).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

try:
    import numpy as np
except ImportError as e:  # run.py turns this into one failed case
    raise ImportError("%s cannot import numpy (%s): install python3-numpy (make deps)"
                      % (sys.executable, e)) from None

import pfutil

N = 300
VENV_PACKAGES = "python3-venv python3-pip python3-setuptools python3-wheel"


def clean_env(**extra):
    """The environment of the commands run here: no make jobserver of the
    `make check` around us, no Python path into the checkout, no pip
    configuration that could reach a package index (the index is a closed
    local port: a download try fails instead of passing unseen), and no
    PREFETCH_LIB unless one is given."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIP_", "MAKE", "MFLAGS", "PYTHON", "PREFETCH"))}
    env.update(PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_NO_CACHE_DIR="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_CONFIG_FILE=os.devnull)
    env.update(extra)
    return env


def run(cmd, **kw):
    kw.setdefault("env", clean_env())
    kw.setdefault("timeout", 300)
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


class Install(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="pf-pyinstall-")

    @classmethod
    def tearDownClass(cls):
        if not os.environ.get("PF_KEEP_TMP"):
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def make_install(self, *args):
        out = run(["make", "-C", pfutil.ROOT, "--no-print-directory", "install"] + list(args))
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        return out.stdout

    def venv(self):
        """A venv with the package pip-installed from a copy of python/ (pip
        builds in the source tree: the checkout stays clean)."""
        src = os.path.join(self.tmp, "src")
        shutil.copytree(os.path.join(pfutil.ROOT, "python"), src,
                        ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info",
                                                      "*.so"))
        venv = os.path.join(self.tmp, "venv")
        out = run([sys.executable, "-m", "venv", "--system-site-packages", venv])
        if out.returncode != 0 or not os.path.exists(os.path.join(venv, "bin", "pip")):
            self.fail("%s -m venv failed (install %s): %s" % (sys.executable, VENV_PACKAGES,
                                                              out.stdout + out.stderr))
        out = run([os.path.join(venv, "bin", "pip"), "install", "--no-build-isolation", src])
        log = out.stdout + out.stderr
        print(log.strip().splitlines()[-1] if log.strip() else "(pip said nothing)")
        self.assertEqual(out.returncode, 0, "pip install failed (it needs %s): %s"
                         % (VENV_PACKAGES, log))
        self.assertNotIn("Downloading", log)
        return os.path.join(venv, "bin", "python")

    def test_make_install_says_how_to_install_the_python_package_in_one_line(self):
        stage = os.path.join(self.tmp, "stage-line")
        out = self.make_install("DESTDIR=" + stage, "PREFIX=/usr")
        said = [line for line in out.splitlines() if line.startswith("python:")]
        self.assertEqual(len(said), 1, out)
        self.assertIn("pip install --no-build-isolation ./python", said[0])
        self.assertIn("PYTHONDIR=", said[0])
        self.assertFalse(os.path.exists(os.path.join(stage, "usr", "lib", "python3")))

    def test_pip_installs_offline_into_a_venv_and_a_trainer_outside_the_tree_runs(self):
        stage = os.path.join(self.tmp, "stage")
        self.make_install("DESTDIR=" + stage, "PREFIX=/usr")
        lib = os.path.join(stage, "usr", "lib", "libprefetch.so.0")
        prefetchd = os.path.join(stage, "usr", "bin", "prefetchd")
        self.assertTrue(os.path.exists(lib))
        python = self.venv()

        # The installed daemon, serving a dataset written here.
        rng = np.random.default_rng(77)
        arrays = {"img": rng.integers(0, 256, size=(N, 3, 4), dtype=np.uint8),
                  "lab": rng.integers(-2**40, 2**40, size=N, dtype=np.int64)}
        paths = {}
        for name, arr in arrays.items():
            paths[name] = os.path.join(self.tmp, name + ".npy")
            np.save(paths[name], arr)
        saved = pfutil.PREFETCHD
        pfutil.PREFETCHD = prefetchd
        try:
            daemon = pfutil.Daemon("install", {"ds": paths}, env={"CUDA_VISIBLE_DEVICES": ""})
        finally:
            pfutil.PREFETCHD = saved
        self.addCleanup(daemon.stop)

        trainer = r"""
import json, sys
import numpy as np
import prefetch
paths = json.loads(sys.argv[1])
arrays = {k: np.load(v) for k, v in paths.items()}
loader = prefetch.Loader("ds", batch_size=64, seed=3, socket=sys.argv[2])
picks, bad = [], 0
for batch in loader:
    for name, src in arrays.items():
        bad += not np.array_equal(batch[name], src[batch.picks])
    picks += batch.picks.tolist()
print(json.dumps({"file": prefetch.__file__, "lib": prefetch.library_path(),
                  "version": prefetch.__version__, "picks": picks, "bad": bad,
                  "len": len(loader)}))
"""
        away = os.path.join(self.tmp, "elsewhere")
        os.makedirs(away, exist_ok=True)
        out = run([python, "-B", "-c", trainer, json.dumps(paths), daemon.sock], cwd=away,
                  env=clean_env(PREFETCH_LIB=lib))
        self.assertEqual(out.returncode, 0, out.stderr)
        got = json.loads(out.stdout)
        # The venv's copy, not the checkout's, with the installed library.
        self.assertTrue(got["file"].startswith(os.path.join(self.tmp, "venv")), got["file"])
        self.assertEqual(got["lib"], lib)
        self.assertEqual(got["bad"], 0)
        self.assertEqual(got["picks"], pfutil.shuffle(N, 3))
        self.assertEqual(got["len"], -(-N // 64))
        with open(os.path.join(pfutil.ROOT, "Makefile")) as f:
            version = re.search(r"^VERSION\s*:=\s*(\S+)", f.read(), re.M).group(1)
        self.assertEqual(got["version"], version)

        # Without PREFETCH_LIB nor a copy beside the package, the error
        # names what was tried (unless a libprefetch is on this system).
        out = run([python, "-B", "-c", "import prefetch; print(prefetch.library_path())"],
                  cwd=away)
        if out.returncode != 0:
            self.assertIn("libprefetch not found; tried: $PREFETCH_LIB (not set)", out.stderr)
            self.assertIn("site-packages/prefetch/libprefetch.so (absent)", out.stderr)

    def test_make_install_pythondir_puts_the_package_beside_a_link_to_the_library(self):
        prefix = os.path.join(self.tmp, "prefix")
        pydir = os.path.join(prefix, "py")
        args = ("PREFIX=" + prefix, "PYTHONDIR=" + pydir)
        out = self.make_install(*args)
        self.assertNotIn("python: not installed", out)
        link = os.path.join(pydir, "prefetch", "libprefetch.so")
        self.assertEqual(os.readlink(link), os.path.join(prefix, "lib", "libprefetch.so.0"))
        away = os.path.join(self.tmp, "elsewhere2")
        os.makedirs(away, exist_ok=True)
        out = run([sys.executable, "-B", "-c",
                   "import prefetch; print(prefetch.__file__); print(prefetch.library_path())"],
                  cwd=away, env=clean_env(PYTHONPATH=pydir))
        self.assertEqual(out.returncode, 0, out.stderr)
        where, lib = out.stdout.split()
        self.assertEqual(where, os.path.join(pydir, "prefetch", "__init__.py"))
        self.assertEqual(lib, link)
        out = run(["make", "-C", pfutil.ROOT, "--no-print-directory", "uninstall"] + list(args))
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        left = [os.path.join(d, f) for d, _, files in os.walk(prefix) for f in files]
        self.assertEqual(left, [])


if __name__ == "__main__":
    unittest.main()
