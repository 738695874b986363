"""Running a task's checks in a sandbox: the test checkpoint and the shell checkpoints."""

from __future__ import annotations

import random
import re
import shlex
import time
from pathlib import Path

from envforge.sandbox.container import Sandbox
from envforge.task import VERIFIER_DIR, ShellCheckpoint, Task, TestCheckpoint
from envforge.verify.parsers import ReportError, ReportIncomplete, parse_pattern, parse_report_lines, parse_tap
from envforge.verify.result import CheckpointResult

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


def test_command(check: TestCheckpoint, order: list[str]) -> tuple[str, bool]:
    """(shell command, whether it reports on fd 3) for the framework."""
    ids = " ".join(shlex.quote(t) for t in order)
    if check.framework == "pytest":
        plugins = " ".join(f"-p {shlex.quote(p)}" for p in check.plugins)
        base = _pytest_invocation(check.command)
        return f"{base} -p envforge_reporter -p no:cacheprovider {plugins} -q -o addopts= {ids}", True
    if check.framework == "unittest":
        return f"{check.command or 'python3'} -P {RUNNER_DIR}/unittest_runner.py {ids}", True
    return check.command or "", False


def _run_reported(sandbox: Sandbox, check: TestCheckpoint, order: list[str]) -> tuple[dict[str, str], list[str]]:
    """(status per reported test id, infrastructure/report reasons) for one run of the given ids
    (all tests the command collects when `order` is empty).

    Every sandbox process is killed afterwards, so nothing the tests started lives on into
    the shell checkpoints.
    """
    cmd, reports = test_command(check, order)
    res = sandbox.exec(cmd, timeout_s=check.timeout_s, env=CLEAN_ENV, report=reports)
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


def run_tests(sandbox: Sandbox, check: TestCheckpoint, shuffle_seed: int | None = None) -> tuple[dict[str, str], list[str]]:
    """Run the required tests; statuses come from the report pipe (pytest, unittest) or stdout (tap, pattern)."""
    order = list(check.ids)
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(order)
    statuses, reasons = _run_reported(sandbox, check, order)
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
    return _run_reported(sandbox, check, [])


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
