"""Running a task's checks in a sandbox: the test checkpoint and the shell checkpoints."""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path

from envforge.sandbox.container import Sandbox
from envforge.task import VERIFIER_DIR, ShellCheckpoint, Task, TestCheckpoint
from envforge.verify.parsers import ReportError, ReportIncomplete, parse_pattern, parse_report_lines, parse_tap
from envforge.verify.result import CheckpointResult
from envforge.verify.selection import SUITE, TARGETED, TestRun, selection_env, unittest_ids

RUNNER_DIR = "/run/envforge-verifier/runner"
_RUNNERS = {name: (Path(__file__).parent / "runners" / name).read_bytes()
            for name in ("unittest_runner.py", "envforge_reporter.py")}
# pytest from the system, before anything in the workspace can shadow it (-P: no cwd on
# sys.path; the workspace is appended after the stdlib and site-packages), with our reporter.
_PYTEST = ("python3 -P -c 'import sys; sys.path.insert(0, \"" + RUNNER_DIR + "\"); import pytest; "
           "sys.path.append(\".\"); sys.exit(pytest.main(sys.argv[1:]))'")
# Test runs must not pick up plugins or start-up hooks the workspace could smuggle in.
CLEAN_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1",
             "PYTHONPATH": "/run/envforge-verifier/runner"}


def install_verifier_files(sandbox: Sandbox, task: Task) -> None:
    """Install the verifier's files and our runners root-owned (read-only to every command)."""
    files = task.verifier_bytes()
    if files:
        sandbox.install_files(VERIFIER_DIR, files, mode=0o755)
    sandbox.install_files(RUNNER_DIR, _RUNNERS, mode=0o644)


_PYTEST_PREFIXES = ("python3 -m pytest", "python -m pytest", "pytest", "py.test")


def _pytest_invocation(command: str | None) -> str:
    """Our safe launcher plus the task's extra arguments.

    A command that starts like a plain pytest call (`python3 -m pytest tests -x`) keeps its
    arguments but runs through the launcher; anything else (a `cd sub && ...` wrapper) runs
    as written, with only the reporter on PYTHONPATH, and without the launcher's protection
    against workspace modules shadowing pytest.
    """
    if not command:
        return _PYTEST
    for prefix in _PYTEST_PREFIXES:
        if command == prefix or command.startswith(prefix + " "):
            return _PYTEST + command[len(prefix):]
    return command


def test_command(check: TestCheckpoint, run: TestRun = TARGETED) -> tuple[str, bool, dict[str, str]]:
    """(shell command, whether it reports on fd 3, extra environment) for the framework and the run."""
    if check.framework == "pytest":
        plugins = " ".join(f"-p {shlex.quote(p)}" for p in check.plugins)
        base = _pytest_invocation(check.command)
        return (f"{base} -p envforge_reporter -p no:cacheprovider {plugins} -q -o addopts=", True,
                selection_env(check, run))
    if check.framework == "unittest":
        ids = " ".join(shlex.quote(t) for t in unittest_ids(check, run))
        return (f"{check.command or 'python3'} -P {RUNNER_DIR}/unittest_runner.py {ids}".rstrip(), True,
                selection_env(check, run))
    return check.command or "", False, {}


def _run_reported(sandbox: Sandbox, check: TestCheckpoint, run: TestRun) -> tuple[dict[str, str], list[str]]:
    """(status per reported test id, infrastructure/report reasons) for one run of the check.

    Every sandbox process is killed afterwards, so nothing the tests started lives on into
    the shell checkpoints.
    """
    cmd, reports, env = test_command(check, run)
    res = sandbox.exec(cmd, timeout_s=check.timeout_s, env={**CLEAN_ENV, **env}, report=reports)
    sandbox.kill_processes()
    reasons: list[str] = []
    if res.timed_out:
        reasons.append("timeout")
    if res.oom_killed:
        reasons.append("oom")
    try:
        if check.framework in ("pytest", "unittest"):
            if not res.report:
                reasons.append("report_missing")
                statuses = {}
            else:
                statuses = parse_report_lines(res.report)
        elif check.framework == "tap":
            statuses = parse_tap(res.text())
        else:
            statuses = parse_pattern(res.text(), check.pattern or "")
    except ReportIncomplete:
        statuses = {}
        reasons.append("report_incomplete")
    except ReportError:
        statuses = {}
        reasons.append("report_unreadable")
    return statuses, reasons


def run_tests(sandbox: Sandbox, check: TestCheckpoint, run: TestRun = TARGETED) -> tuple[dict[str, str], list[str]]:
    """The status of every required test (FAIL_TO_PASS, PASS_TO_PASS), and the reasons it fails.

    Statuses come from the report pipe (pytest, unittest) or stdout (tap, pattern); a required
    id the run did not report is `missing`, whatever else the run did.
    """
    statuses, reasons = _run_reported(sandbox, check, run)
    tests: dict[str, str] = {}
    for test_id in check.ids:
        status = statuses.get(test_id, "missing")
        tests[test_id] = status
        if status == "missing":
            reasons.append(f"test_missing:{test_id}")
        elif status != "passed":
            reasons.append(f"test_failed:{test_id}")
    return tests, reasons


def run_suite(sandbox: Sandbox, check: TestCheckpoint) -> tuple[dict[str, str], list[str]]:
    """Every test the check's command collects, with its status: how sources derive FAIL_TO_PASS."""
    return _run_reported(sandbox, check, SUITE)


def run_shell_checkpoint(sandbox: Sandbox, check: ShellCheckpoint) -> CheckpointResult:
    started = time.perf_counter()
    res = sandbox.exec(check.run, timeout_s=check.timeout_s, env={"ENVFORGE_VERIFIER": VERIFIER_DIR})
    matched = None
    if check.stdout_pattern is not None:
        matched = re.search(check.stdout_pattern, res.text(), re.MULTILINE) is not None
    passed = res.exit_code == check.expect_exit and not res.timed_out and matched is not False
    tail = (res.text() + res.err_text())[-400:]
    return CheckpointResult(check.name, passed, res.exit_code, check.expect_exit, matched,
                            time.perf_counter() - started, res.timed_out, tail)
