"""Running a task's checks in a sandbox: the test checkpoint and the shell checkpoints."""

from __future__ import annotations

import re
import secrets
import time

from envforge.sandbox.container import Sandbox
from envforge.task import REPORTS_DIR, VERIFIER_DIR, ShellCheckpoint, Task, TestCheckpoint
from envforge.verify.junit import ReportError, parse_junit
from envforge.verify.result import CheckpointResult

# pytest must not pick up plugins the workspace could smuggle in, nor write caches.
PYTEST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}


def install_verifier_files(sandbox: Sandbox, task: Task) -> None:
    """Place the verifier's own files; they never exist in the workspace the policy edits."""
    files = task.verifier_bytes()
    if files:
        sandbox.put_files(VERIFIER_DIR, files, mode=0o755)


def run_tests(sandbox: Sandbox, check: TestCheckpoint) -> tuple[dict[str, str], list[str]]:
    """Run the test command with a JUnit report under /run/envforge; statuses per required test."""
    report = f"{REPORTS_DIR}/junit-{secrets.token_hex(8)}.xml"
    sandbox.exec(f"mkdir -p {REPORTS_DIR}", timeout_s=30, workdir="/")
    cmd = (f"{check.command} -p no:cacheprovider -o junit_family=xunit1 "
           f"--junitxml={report} -q")
    res = sandbox.exec(cmd, timeout_s=check.timeout_s, env=PYTEST_ENV)
    reasons: list[str] = []
    if res.timed_out:
        reasons.append("timeout")
    if res.oom_killed:
        reasons.append("oom")
    try:
        statuses = parse_junit(sandbox.read_file(report))
    except (FileNotFoundError, ReportError) as exc:
        statuses = {}
        reasons.append("report_missing" if isinstance(exc, FileNotFoundError) else "report_unreadable")
    tests: dict[str, str] = {}
    for test_id in [*check.fail_to_pass, *check.pass_to_pass]:
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
