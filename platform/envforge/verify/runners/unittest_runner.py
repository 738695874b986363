"""Run unittest test ids and write one JSON line per test to fd 3 (the agent's report pipe).

Usage (in the grading sandbox): python3 unittest_runner.py ID [ID ...]
An id that cannot be loaded is reported as an error, never as a pass.
"""

import json
import os
import sys
import unittest

out = os.fdopen(3, "w", buffering=1)


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


sys.path.insert(0, os.getcwd())
loader = unittest.TestLoader()
for test_id in sys.argv[1:]:
    try:
        suite = loader.loadTestsFromName(test_id)
    except Exception:  # noqa: BLE001 - an unloadable test is an error outcome
        emit(test_id, "error")
        continue
    suite.run(Result())
out.close()
