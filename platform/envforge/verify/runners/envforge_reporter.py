"""A pytest plugin that reports outcomes to the grader over a private pipe.

Loaded with `-p envforge_reporter` from a root-owned directory before any workspace code is
imported. At import it moves the report pipe from fd 3 to an unpredictable high descriptor
and closes fd 3, so code under test finds no report path in argv and no fd 3 to write a
forged report to. It writes one JSON line per test outcome and, only if the session ends
normally, a final `{"finished": true, ...}` line: a run cut short (os._exit, a crash, a
kill) has no trailer and counts as a failure.
"""

import fcntl
import json
import os
import random

_fd = fcntl.fcntl(3, fcntl.F_DUPFD_CLOEXEC, random.randint(300, 900))
os.close(3)
_out = os.fdopen(_fd, "w", buffering=1)
_outcomes: dict = {}


def _status(report):
    if report.when == "call":
        if report.passed:
            return "passed"
        return "skipped" if report.skipped else "failed"
    if report.failed:
        return "error"
    if report.skipped:
        return "skipped"
    return None


_ORDER = ["passed", "skipped", "failed", "error"]


def pytest_runtest_logreport(report):
    status = _status(report)
    if status is None:
        return
    old = _outcomes.get(report.nodeid)
    if old is None or _ORDER.index(status) > _ORDER.index(old):
        _outcomes[report.nodeid] = status


def pytest_sessionfinish(session, exitstatus):
    for nodeid, status in sorted(_outcomes.items()):
        _out.write(json.dumps({"id": nodeid, "status": status}) + "\n")
    _out.write(json.dumps({"finished": True, "exitstatus": int(exitstatus)}) + "\n")
    _out.flush()
