"""Run unittest test ids and write one JSON line per test to the agent's report pipe.

Usage (in the grading sandbox): python3 -P unittest_runner.py [ID ...]
With no ids every test under the working directory is discovered (a whole-suite run).
ENVFORGE_TEST_ORDER=reverse runs the tests in reverse order. The pipe arrives on fd 3 and is
moved to an unpredictable descriptor before any test code is imported. An id that cannot be
loaded is reported as an error, never as a pass, and only a run that ends normally writes the
closing `{"finished": true}` line.
"""

import fcntl
import json
import os
import random
import sys
import unittest

_fd = fcntl.fcntl(3, fcntl.F_DUPFD_CLOEXEC, random.randint(300, 900))
os.close(3)
out = os.fdopen(_fd, "w", buffering=1)
reverse = os.environ.pop("ENVFORGE_TEST_ORDER", "") == "reverse"


def emit(test_id, status):
    out.write(json.dumps({"id": test_id, "status": status}) + "\n")


class Result(unittest.TestResult):
    def addSuccess(self, test):
        emit(test.id(), "passed")

    def addFailure(self, test, err):
        emit(test.id(), "failed")
        super().addFailure(test, err)

    def addError(self, test, err):
        emit(getattr(test, "id", lambda: str(test))(), "error")
        super().addError(test, err)

    def addSkip(self, test, reason):
        emit(test.id(), "skipped")

    def addExpectedFailure(self, test, err):
        emit(test.id(), "skipped")

    def addUnexpectedSuccess(self, test):
        emit(test.id(), "failed")


def flatten(suite):
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from flatten(item)
        else:
            yield item


sys.path.append(os.getcwd())  # after the stdlib: a workspace module cannot shadow one
loader = unittest.TestLoader()
tests = []
if len(sys.argv) > 1:
    for test_id in sys.argv[1:]:
        try:
            tests.extend(flatten(loader.loadTestsFromName(test_id)))
        except Exception:  # noqa: BLE001 - an unloadable test is an error outcome
            emit(test_id, "error")
else:
    tests.extend(flatten(loader.discover(".", top_level_dir=".")))
if reverse:
    tests.reverse()
unittest.TestSuite(tests).run(Result())  # a suite, so setUpClass/setUpModule still run
out.write(json.dumps({"finished": True}) + "\n")
out.close()
