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
the first of which does not pass (ENVFORGE_FAIL_FAST, a JSON list), and, for a mutant's
grading, the only ids to run (ENVFORGE_TEST_IDS, a JSON list: every other collected test is
deselected). ENVFORGE_TRACE_CALLS ({"files": [absolute paths], "out": path}) has it record which
functions of those files each test calls (see `_CallTracer`). No test id is ever
passed to pytest, so an unknown id is missing from the report, never the reason the whole
run stops ("ERROR: not found"). Collection errors are reported with their message, so a
missing dependency can be named.
"""

import contextlib
import fcntl
import functools
import json
import os
import random
import sys
import threading
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
_ids = os.environ.pop("ENVFORGE_TEST_IDS", None)
_RUN_ONLY = frozenset(json.loads(_ids)) if _ids else None
_session = None


class _CallTracer:
    """Which functions of the traced files each test calls, for selecting a mutant's tests.

    A mutant changes the body of one function; a test that never calls that function runs the same
    code as with the reference, so only the tests that call it need to run (covering.py). A call is
    recorded by its code object's file and first line. It is recorded for no single test but for all
    (`everywhere`) when it happens outside a test (imports, collection) or while a fixture wider than a
    function is set up (its value outlives the test that set it up). A test that starts a process
    (fork, spawn, subprocess, multiprocessing) may call anything in it, unseen: it is listed in
    `spawners`. Threads started after tracing begins are traced too, and so are audit hooks added after
    it (CPython runs them untraced unless they allow it). Calls made while a module's top level runs (a
    first import inside a test) and in a teardown that leaves a module, a class or the session (wider
    fixtures finish there) count for all tests too. If the trace function was replaced (a test
    that traces, a debugger) or a hook cannot be made traceable, `broken` says so and nothing may be
    selected from the record.
    """

    def __init__(self, files, out):
        self.targets = frozenset(os.path.realpath(f) for f in files)
        self.out = out
        self.pid = os.getpid()
        self.known = {}  # co_filename -> its real path if traced, else ""
        self.current = None  # the test whose protocol is running
        self.shared = 0  # depth of `for_all` regions in progress (module code, wide fixtures)
        self.calls = {}
        self.everywhere = set()
        self.spawners = set()
        self.spawned_outside = False
        self.broken = ""

    def __call__(self, frame, event, arg):
        if event == "call":
            try:
                code = frame.f_code
                path = self.known.get(code.co_filename)
                if path is None:
                    real = os.path.realpath(code.co_filename)
                    path = self.known[code.co_filename] = real if real in self.targets else ""
                if path:
                    key = (path, code.co_firstlineno)
                    if self.current is None or self.shared:
                        self.everywhere.add(key)
                    else:
                        self.calls.setdefault(self.current, set()).add(key)
            except Exception as exc:  # a trace function that raises is dropped for its thread: say so
                self.broken = self.broken or f"the trace failed: {exc!r}"[:300]
        return None

    @contextlib.contextmanager
    def for_all(self, when=True):
        """While inside (and `when`), every call is counted for all tests (module code, wide fixtures)."""
        self.shared += int(when)
        try:
            yield
        finally:
            self.shared -= int(when)

    def wide(self, fn):
        """`fn` with every call it makes counted for all tests."""

        @functools.wraps(fn)
        def counted(*args, **kwargs):
            with self.for_all():
                return fn(*args, **kwargs)

        return counted

    def spawned(self):
        if self.current is None or self.shared:
            self.spawned_outside = True
        else:
            self.spawners.add(self.current)

    def start(self):
        for module, names in ((os, ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system")),):
            for name in names:
                if hasattr(module, name):
                    setattr(module, name, self._flagging(getattr(module, name)))
        import subprocess  # every Popen starts its child in _execute_child (fork_exec or posix_spawn)

        subprocess.Popen._execute_child = self._flagging(subprocess.Popen._execute_child)
        try:
            import _posixsubprocess  # multiprocessing's spawn starts its children through it

            _posixsubprocess.fork_exec = self._flagging(_posixsubprocess.fork_exec)
        except ImportError:
            pass
        # CPython calls audit hooks with tracing off unless the hook says `__cantrace__`: a project's own hook
        # (filelock watches forks and sqlite3 connections with one) would otherwise never show as called.
        add_hook = sys.addaudithook

        def addaudithook(hook):
            try:
                hook.__cantrace__ = True
            except (AttributeError, TypeError):  # a builtin or a slotted object: its calls stay unseen
                self.broken = self.broken or f"an audit hook that cannot be traced was added: {hook!r}"[:300]
            return add_hook(hook)

        sys.addaudithook = addaudithook
        import _thread  # threads started without the threading module get the trace function too

        start_new_thread = _thread.start_new_thread
        tracer = self

        def traced_start(function, args, kwargs=None):
            def run(*a, **k):
                sys.settrace(tracer)
                return function(*a, **k)

            return start_new_thread(run, args, kwargs or {})

        _thread.start_new_thread = traced_start
        # A module first imported inside a test runs its top level there, and what it computes (a table, a
        # registry) serves every later test: calls made while a module's code runs count for all tests.
        import importlib._bootstrap_external as external

        external._LoaderBasics.exec_module = self.wide(external._LoaderBasics.exec_module)
        import multiprocessing.process  # a forkserver's children are forked by the server, not here

        start = multiprocessing.process.BaseProcess.start
        multiprocessing.process.BaseProcess.start = self._flagging(start)
        threading.settrace(self)
        sys.settrace(self)

    def _flagging(self, fn):
        @functools.wraps(fn)
        def flagged(*args, **kwargs):
            self.spawned()
            return fn(*args, **kwargs)

        return flagged

    def check(self, nodeid):
        """After each test: the trace function must still be ours, or the record misses calls."""
        if sys.gettrace() is not self and not self.broken:
            self.broken = f"{nodeid} replaced the trace function"
            sys.settrace(self)

    def write(self):
        if os.getpid() != self.pid:  # a forked child that came back into pytest: the parent reports
            return
        sys.settrace(None)
        doc = {
            "calls": {t: sorted(map(list, keys)) for t, keys in self.calls.items()},
            "everywhere": sorted(map(list, self.everywhere)),
            "spawners": sorted(self.spawners),
            "spawned_outside": self.spawned_outside,
            "broken": self.broken,
        }
        try:  # without the record the grader grades every test: never a reason to lose the report
            with open(self.out, "w") as fh:
                json.dump(doc, fh)
        except OSError:
            pass


_trace = os.environ.pop("ENVFORGE_TRACE_CALLS", None)
_TRACER = _CallTracer(**json.loads(_trace)) if _trace else None
if _TRACER is not None:
    _TRACER.start()


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
    if _RUN_ONLY is not None:
        deselected = [i for i in items if i.nodeid not in _RUN_ONLY]
        if deselected:
            items[:] = [i for i in items if i.nodeid in _RUN_ONLY]
            config.hook.pytest_deselected(items=deselected)
    if _REVERSE:
        items.reverse()
    if _FAIL_FAST:  # FAIL_TO_PASS first, each group in the order it had
        items[:] = [i for i in items if i.nodeid in _FAIL_FAST] + [i for i in items if i.nodeid not in _FAIL_FAST]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _TRACER is None:
        yield
        return
    _TRACER.current = item.nodeid
    try:
        yield
    finally:
        _TRACER.check(item.nodeid)
        _TRACER.current = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """A teardown that leaves a module or class (or the session) also finishes its wider fixtures, which
    other tests set up: what they call then counts for all tests."""
    if _TRACER is None:
        yield
        return
    leaving = (
        nextitem is None
        or getattr(nextitem, "module", None) is not getattr(item, "module", None)
        or getattr(nextitem, "cls", None) is not getattr(item, "cls", None)
    )
    with _TRACER.for_all(leaving):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    if _TRACER is None:
        yield
        return
    with _TRACER.for_all(fixturedef.scope != "function"):
        yield


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
    if _TRACER is not None:
        _TRACER.write()
    for nodeid, message in sorted(_collect_errors.items()):
        _out.write(json.dumps({"collect_error": nodeid, "message": message}) + "\n")
    for nodeid, status in sorted(_outcomes.items()):
        record = {"id": nodeid, "status": status}
        if _messages.get(nodeid):
            record["message"] = _messages[nodeid]
        _out.write(json.dumps(record) + "\n")
    _out.write(json.dumps({"finished": True, "exitstatus": int(exitstatus)}) + "\n")
    _out.flush()
