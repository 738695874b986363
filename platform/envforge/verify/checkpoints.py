"""Running a task's checks in a sandbox: the test checkpoint and the shell checkpoints."""

from __future__ import annotations

import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from envforge.environment import PythonEnvironment, merge_env, split_assignments
from envforge.sandbox.container import PythonCommand, Sandbox
from envforge.task import VERIFIER_DIR, WORKSPACE, ShellCheckpoint, Task, TestCheckpoint
from envforge.verify.parsers import (
    ReportError,
    ReportIncomplete,
    parse_failure_messages,
    parse_pattern,
    parse_report,
    parse_tap,
)
from envforge.verify.result import CheckpointResult
from envforge.verify.selection import SUITE, TARGETED, TestRun, judged_ids, selection_env, unittest_ids

RUNNER_DIR = "/run/envforge-verifier/runner"
_RUNNERS = {
    name: (Path(__file__).parent / "runners" / name).read_bytes()
    for name in ("unittest_runner.py", "envforge_reporter.py", "pytest_launcher.py")
}
# pytest from the system, before anything in the workspace can shadow it, and the project's own
# modules from the work tree (runners/pytest_launcher.py says how).
_LAUNCHER = f"{RUNNER_DIR}/pytest_launcher.py"
_PYTEST = f"python3 -P {_LAUNCHER}"
# What bash would expand or treat as syntax outside single quotes: a command with any of them is
# never said as data (PythonCommand), so its words are exactly what the shell would pass.
_SHELL_SYNTAX = frozenset('$`"\\*?[]{}~;&|<>()#!\n\t')
# Test runs must not pick up plugins or start-up hooks the workspace could smuggle in.
CLEAN_ENV = {
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONNOUSERSITE": "1",
    "PYTHONPATH": RUNNER_DIR,
}


def install_verifier_files(sandbox: Sandbox, task: Task) -> None:
    """Install the verifier's files and our runners root-owned (read-only to every command)."""
    files = task.verifier_bytes()
    if files:
        sandbox.install_files(VERIFIER_DIR, files, mode=0o755)
    sandbox.install_files(RUNNER_DIR, _RUNNERS, mode=0o644)


_PYTEST_PREFIXES = ("python3 -m pytest", "python -m pytest", "pytest", "py.test")


def _pytest_invocation(command: str | None) -> tuple[str, bool]:
    """(our safe launcher plus the task's extra arguments, whether the launcher is used).

    A command that starts like a plain pytest call (`python3 -m pytest tests -x`) keeps its
    arguments but runs through the launcher; anything else (a `cd sub && ...` wrapper) runs
    as written, with only the reporter on PYTHONPATH, and without the launcher's protection
    against workspace modules shadowing pytest.
    """
    if not command:
        return _PYTEST, True
    for prefix in _PYTEST_PREFIXES:
        if command == prefix or command.startswith(prefix + " "):
            return _PYTEST + command[len(prefix) :], True
    return command, False


def test_command(
    check: TestCheckpoint, run: TestRun = TARGETED, environment: PythonEnvironment | None = None
) -> tuple[str, bool, dict[str, str]]:
    """(shell command, whether it reports on fd 3, its variables) for the framework and the run.

    Leading `NAME=value` words of the command become variables merged with the task's and
    envforge's (so `PYTHONPATH=src python3 -m pytest` keeps the launcher and the reporter).
    Which tests run and in what order is told to envforge's pytest plugin or unittest runner
    through the variables of selection.py, never through pytest's command line.
    """
    prefix_env, command = split_assignments(check.command) if check.command else ({}, check.command)
    user = {**(environment.env if environment else {}), **prefix_env}
    envforge = {**CLEAN_ENV, **selection_env(check, run)}
    if check.framework == "pytest":
        plugins = " ".join(f"-p {shlex.quote(p)}" for p in check.plugins)
        base, launcher = _pytest_invocation(command)
        if launcher:
            workdir = environment.command_workdir() if environment else WORKSPACE
            paths = [e if e.startswith("/") else f"{workdir}/{e}" for e in user.pop("PYTHONPATH", "").split(":") if e]
            if paths:
                envforge["ENVFORGE_PYTHONPATH"] = ":".join(paths)
            if check.modules:
                envforge["ENVFORGE_PROJECT_MODULES"] = ",".join(check.modules)
        # A derivation's run (the whole suite, or the files a change touches) goes on past a module that
        # does not import, and says why.
        extra = " --continue-on-collection-errors" if run.scope == "suite" or run.files else ""
        return (
            f"{base} -p envforge_reporter -p no:cacheprovider {plugins} -q -o addopts={extra}",
            True,
            merge_env(user, envforge),
        )
    env = merge_env(user, envforge)
    if check.framework == "unittest":
        ids = " ".join(shlex.quote(t) for t in unittest_ids(check, run))
        return f"{command or 'python3'} -P {RUNNER_DIR}/unittest_runner.py {ids}".rstrip(), True, env
    return command or "", False, env


def literal_words(text: str) -> list[str] | None:
    """The words bash passes for `text` when it expands nothing: plain words and single-quoted
    parts only (as shlex.quote writes them); None for anything else (variables, globs, double
    quotes, backslashes, operators)."""
    words: list[str] = []
    current: list[str] = []
    in_word = False
    i = 0
    while i < len(text):
        c = text[i]
        if c == "'":
            end = text.find("'", i + 1)
            if end < 0:
                return None
            current.append(text[i + 1 : end])
            in_word, i = True, end + 1
        elif c == " ":
            if in_word:
                words.append("".join(current))
                current, in_word = [], False
            i += 1
        elif c in _SHELL_SYNTAX:
            return None
        else:
            current.append(c)
            in_word, i = True, i + 1
    if in_word:
        words.append("".join(current))
    return words


def launcher_program(command: str) -> PythonCommand | None:
    """The pytest launcher's command said as data, so the sandbox may run it as a fork of an
    interpreter that has imported pytest already (what the launcher imports first, with the work
    tree off sys.path, so a fork imports the same); None when the command is anything else."""
    if not command.startswith(_PYTEST + " "):
        return None
    args = literal_words(command[len(_PYTEST) :])
    return None if args is None else PythonCommand(_LAUNCHER, tuple(args), preload=("pytest",))


@dataclass(frozen=True)
class SuiteRun:
    """One run of a test command: statuses by id, problems with the run, and collection errors."""

    statuses: dict[str, str]
    reasons: list[str]
    collect_errors: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)  # failed test -> its one-line failure


def _run_reported(
    sandbox: Sandbox, check: TestCheckpoint, run: TestRun, environment: PythonEnvironment | None = None
) -> SuiteRun:
    """One run of the check (the required ids' test files or the whole suite, see selection.py).

    Every sandbox process is killed afterwards, so nothing the tests started lives on into
    the shell checkpoints.
    """
    cmd, reports, env = test_command(check, run, environment)
    workdir = environment.command_workdir() if environment else WORKSPACE
    python = None if run.fresh_interpreter else launcher_program(cmd)
    res = sandbox.exec(cmd, timeout_s=check.timeout_s, env=env, report=reports, workdir=workdir, python=python)
    sandbox.kill_processes()
    reasons: list[str] = []
    collect_errors: dict[str, str] = {}
    messages: dict[str, str] = {}
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
                statuses, collect_errors = parse_report(res.report)
                messages = parse_failure_messages(res.report)
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
    return SuiteRun(statuses, reasons, collect_errors, messages)


def run_tests(
    sandbox: Sandbox, check: TestCheckpoint, run: TestRun = TARGETED, environment: PythonEnvironment | None = None
) -> tuple[dict[str, str], list[str]]:
    """The status of every required test (FAIL_TO_PASS, PASS_TO_PASS), and the reasons it fails.

    Statuses come from the report pipe (pytest, unittest) or stdout (tap, pattern); a required
    id the run did not report is `test_missing` on its own (no id reaches pytest's command
    line, so an unknown one cannot stop the run), whatever else the run did.
    """
    reported = _run_reported(sandbox, check, run, environment)
    reasons = list(reported.reasons)
    tests: dict[str, str] = {}
    for test_id in judged_ids(check, run):
        status = reported.statuses.get(test_id, "missing")
        tests[test_id] = status
        if status == "missing":
            reasons.append(f"test_missing:{test_id}")
        elif status != "passed":
            reasons.append(f"test_failed:{test_id}")
    return tests, reasons


def run_suite(
    sandbox: Sandbox, check: TestCheckpoint, environment: PythonEnvironment | None = None, run: TestRun = SUITE
) -> SuiteRun:
    """Every test the check's command collects, with its status (in collection order, or reversed):
    how sources derive FAIL_TO_PASS. One broken test module does not stop the other modules."""
    return _run_reported(sandbox, check, run, environment)


def run_shell_checkpoint(
    sandbox: Sandbox, check: ShellCheckpoint, environment: PythonEnvironment | None = None
) -> CheckpointResult:
    started = time.perf_counter()
    env = (
        environment.command_env({"ENVFORGE_VERIFIER": VERIFIER_DIR})
        if environment
        else {"ENVFORGE_VERIFIER": VERIFIER_DIR}
    )
    res = sandbox.exec(
        check.run,
        timeout_s=check.timeout_s,
        env=env,
        workdir=environment.command_workdir() if environment else WORKSPACE,
    )
    matched = None
    if check.stdout_pattern is not None:
        matched = re.search(check.stdout_pattern, res.text(), re.MULTILINE) is not None
    passed = res.exit_code == check.expect_exit and not res.timed_out and matched is not False
    tail = (res.text() + res.err_text())[-400:]
    return CheckpointResult(
        check.name,
        passed,
        res.exit_code,
        check.expect_exit,
        matched,
        time.perf_counter() - started,
        res.timed_out,
        tail,
    )
