"""Runs a unittest file and reports in cmocka's words, so that tests/run.sh
counts its cases with the C tests':

    python3 tests/python/run.py tests/python/test_host.py

Each case prints "[ RUN      ] name" then "[       OK ] name",
"[  FAILED  ] name" or "[  SKIPPED ] name" (name: the method's, without
"test_"); failed and skipped cases are listed again at the end, as cmocka
does, and run.sh halves those counts.  The exit status is 1 when a case
failed or errored, else 0.
"""

import importlib.util
import os
import sys
import time
import traceback
import unittest


def case_name(test):
    name = getattr(test, "_testMethodName", None) or str(test)
    return name[5:] if name.startswith("test_") else name


class CmockaResult(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.failed_names = []
        self.skipped_names = []
        self._bad = False

    def _out(self, line):
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    def startTest(self, test):
        super().startTest(test)
        self._bad = False
        self._t0 = time.monotonic()
        self._out("[ RUN      ] " + case_name(test))

    def _fail(self, test, err):
        # Subtests may report several failures for one case; it fails once.
        sys.stdout.write("".join(traceback.format_exception(*err)))
        if not self._bad:
            self._bad = True
            self.failed_names.append(case_name(test))
            self._out("[  FAILED  ] " + case_name(test))

    def addError(self, test, err):
        super().addError(test, err)
        if not hasattr(test, "_testMethodName"):
            # A fixture (setUpClass, ...) that failed: startTest never saw it.
            self._bad = False
        self._fail(test, err)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._fail(test, err)

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._out("subtest %s failed" % subtest._subDescription())
            self._fail(test, err)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._out("skipped: " + reason)
        self.skipped_names.append(case_name(test))
        self._out("[  SKIPPED ] " + case_name(test))

    def addSuccess(self, test):
        super().addSuccess(test)
        if not self._bad:
            self._out("[       OK ] %s (%.2f s)" % (case_name(test), time.monotonic() - self._t0))

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._out("[       OK ] " + case_name(test))

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._fail(test, (AssertionError, AssertionError("unexpected success"), None))


class _Holder:
    """Stands for a module- or class-level fixture that failed."""

    def __init__(self, name):
        self._testMethodName = name


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: %s TEST_FILE.py\n" % argv[0])
        return 2
    path = os.path.abspath(argv[1])
    sys.path.insert(0, os.path.dirname(path))
    result = CmockaResult()
    result._out("[==========] Running tests of %s under %s" % (os.path.basename(path),
                                                             sys.executable))
    try:
        spec = importlib.util.spec_from_file_location(
            os.path.splitext(os.path.basename(path))[0], path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    except Exception:
        # An import that fails (numpy missing, a syntax error) is one failed
        # case that says why, not a silent zero.
        holder = _Holder("import_" + os.path.splitext(os.path.basename(path))[0])
        result.startTest(holder)
        result._fail(holder, sys.exc_info())
        result.testsRun = 1
    else:
        suite.run(result)
    run = result.testsRun
    result._out("[==========] %d test(s) run." % run)
    passed = run - len(result.failed_names) - len(result.skipped_names)
    result._out("[  PASSED  ] %d test(s)." % max(passed, 0))
    if result.skipped_names:
        result._out("[  SKIPPED ] %d test(s), listed below:" % len(result.skipped_names))
        for name in result.skipped_names:
            result._out("[  SKIPPED ] " + name)
    if result.failed_names:
        result._out("[  FAILED  ] %d test(s), listed below:" % len(result.failed_names))
        for name in result.failed_names:
            result._out("[  FAILED  ] " + name)
        result._out("\n %d FAILED TEST(S)" % len(result.failed_names))
    return 1 if result.failed_names else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
