"""A pytest plugin that reports outcomes to the grader over a private pipe.

Loaded with `-p envforge_reporter` from a root-owned directory before any workspace code is
imported. At import it moves the report pipe from fd 3 to an unpredictable high descriptor
and closes fd 3, so code under test finds no report path in argv and no fd 3 to write a
forged report to. It writes one JSON line per test outcome and, only if the session ends
normally, a final `{"finished": true, ...}` line: a run cut short (os._exit, a crash, a
kill) has no trailer and counts as a failure.

The grader also tells it, through environment variables read (and removed) at import,
which test files to collect (ENVFORGE_TEST_FILES, a JSON list of paths relative to the
rootdir: every other test file and every directory holding none of them is ignored) and
in what order to run the collected tests (ENVFORGE_TEST_ORDER=reverse), and, for a grading
that only asks whether a solution scores 0, the FAIL_TO_PASS ids to run first and to stop at
the first of which does not pass (ENVFORGE_FAIL_FAST, a JSON list). No test id is ever
passed to pytest, so an unknown id is missing from the report, never the reason the whole
run stops ("ERROR: not found"). Collection errors are reported with their message, so a
missing dependency can be named.
"""

import fcntl
import json
import os
import random
from pathlib import Path

import pytest

_fd = fcntl.fcntl(3, fcntl.F_DUPFD_CLOEXEC, random.randint(300, 900))
os.close(3)
_out = os.fdopen(_fd, "w", buffering=1)
_outcomes: dict = {}
_messages: dict = {}
_collect_errors: dict = {}
_files = os.environ.pop("ENVFORGE_TEST_FILES", None)
_ONLY = frozenset(Path(p).as_posix() for p in json.loads(_files)) if _files else None
_DIRS = frozenset(str(parent) for p in (_ONLY or ()) for parent in Path(p).parents if str(parent) != ".")
_REVERSE = os.environ.pop("ENVFORGE_TEST_ORDER", "") == "reverse"
_first = os.environ.pop("ENVFORGE_FAIL_FAST", None)
_FAIL_FAST = frozenset(json.loads(_first)) if _first else frozenset()
_session = None


def pytest_sessionstart(session):
    global _session
    _session = session


def pytest_ignore_collect(collection_path, config):
    """Collect only the test files holding the required ids (and the directories on the way to them)."""
    if _ONLY is None:
        return None
    try:
        rel = collection_path.relative_to(config.rootpath).as_posix()
    except ValueError:
        return None
    if rel in _ONLY or collection_path.name in ("__init__.py", "conftest.py"):
        return None
    if collection_path.is_dir():
        return None if rel in _DIRS or rel == "." else True
    return True


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    if _REVERSE:
        items.reverse()
    if _FAIL_FAST:  # FAIL_TO_PASS first, each group in the order it had
        items[:] = [i for i in items if i.nodeid in _FAIL_FAST] + [i for i in items if i.nodeid not in _FAIL_FAST]


def pytest_collectreport(report):
    if report.failed:
        _collect_errors[report.nodeid] = str(getattr(report, "longreprtext", "") or report.longrepr)[-4000:]


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
        if status in ("failed", "error"):
            _messages[report.nodeid] = _crash_message(report)
    if status != "passed" and report.nodeid in _FAIL_FAST and _session is not None:
        _session.shouldfail = f"envforge fail fast: {report.nodeid} did not pass"


def _crash_message(report):
    """What went wrong, in one line (`AssertionError: assert 3 == 5`): how a reporter would quote it."""
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    text = getattr(crash, "message", None)
    if not text:
        lines = [ln for ln in str(getattr(report, "longreprtext", "") or "").splitlines() if ln.strip()]
        text = lines[-1] if lines else ""
    return str(text)[:500]


def pytest_sessionfinish(session, exitstatus):
    for nodeid, message in sorted(_collect_errors.items()):
        _out.write(json.dumps({"collect_error": nodeid, "message": message}) + "\n")
    for nodeid, status in sorted(_outcomes.items()):
        record = {"id": nodeid, "status": status}
        if _messages.get(nodeid):
            record["message"] = _messages[nodeid]
        _out.write(json.dumps(record) + "\n")
    _out.write(json.dumps({"finished": True, "exitstatus": int(exitstatus)}) + "\n")
    _out.flush()
