"""Running a task's checks in a sandbox: the test checkpoint and the shell checkpoints."""

from __future__ import annotations

import random
import re
import shlex
import time
from pathlib import Path

from envforge.sandbox.container import Sandbox
from envforge.task import VERIFIER_DIR, ShellCheckpoint, Task, TestCheckpoint
from envforge.verify.parsers import ReportError, parse_junit, parse_pattern, parse_tap, parse_unittest_lines
from envforge.verify.result import CheckpointResult

RUNNER_DIR = "/run/envforge/runner"
_UNITTEST_RUNNER = (Path(__file__).parent / "runners" / "unittest_runner.py").read_bytes()
# Test runs must not pick up plugins or start-up hooks the workspace could smuggle in.
CLEAN_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1",
             "PYTHONPATH": ""}


def install_verifier_files(sandbox: Sandbox, task: Task) -> None:
    """Place the verifier's own files and runners; they never exist in the workspace the policy edits."""
    files = task.verifier_bytes()
    if files:
        sandbox.put_files(VERIFIER_DIR, files, mode=0o755)
    sandbox.put_files(RUNNER_DIR, {"unittest_runner.py": _UNITTEST_RUNNER})


def test_command(check: TestCheckpoint, order: list[str]) -> tuple[str, bool]:
    """(shell command, whether it reports on fd 3) for the framework."""
    ids = " ".join(shlex.quote(t) for t in order)
    if check.framework == "pytest":
        plugins = " ".join(f"-p {shlex.quote(p)}" for p in check.plugins)
        base = check.command or "python3 -m pytest"
        return (f"{base} -p no:cacheprovider {plugins} -o junit_family=xunit1 --junitxml=/dev/fd/3 -q "
                f"-o addopts= {ids}", True)
    if check.framework == "unittest":
        return f"{check.command or 'python3'} {RUNNER_DIR}/unittest_runner.py {ids}", True
    return check.command or "", False


def run_tests(sandbox: Sandbox, check: TestCheckpoint, shuffle_seed: int | None = None) -> tuple[dict[str, str], list[str]]:
    """Run the required tests; statuses come from the report pipe (pytest, unittest) or stdout (tap, pattern)."""
    order = list(check.ids)
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(order)
    cmd, reports = test_command(check, order)
    res = sandbox.exec(cmd, timeout_s=check.timeout_s, env=CLEAN_ENV, report=reports)
    reasons: list[str] = []
    if res.timed_out:
        reasons.append("timeout")
    if res.oom_killed:
        reasons.append("oom")
    try:
        if check.framework == "pytest":
            statuses = parse_junit(res.report) if res.report else {}
            if not res.report:
                reasons.append("report_missing")
        elif check.framework == "unittest":
            statuses = parse_unittest_lines(res.report or b"")
        elif check.framework == "tap":
            statuses = parse_tap(res.text())
        else:
            statuses = parse_pattern(res.text(), check.pattern or "")
    except ReportError:
        statuses = {}
        reasons.append("report_unreadable")
    tests: dict[str, str] = {}
    for test_id in check.ids:
        status = statuses.get(test_id, "missing")
        tests[test_id] = status
        if status == "missing":
            reasons.append(f"test_missing:{test_id}")
        elif status != "passed":
            reasons.append(f"test_failed:{test_id}")
    return tests, reasons


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
