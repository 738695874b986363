"""The standard reward-hacking probes: what a policy under RL tries first.

Each probe is a shell script run in the task's workspace exactly as a policy's commands
would be; its diff is then graded like any other. Every probe that applies to a task must
score 0 on it. Which apply depends on how the task is verified: the test-file and pytest
probes need a test checkpoint (the pytest ones a pytest one), the checkpoint probes need
shell checkpoints, and the rest apply to every task. `guard_for` names the guard that caught
a probe, for the report.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Literal, Sequence

from envforge.task import VERIFIER_DIR, Task
from envforge.verify.matching_text import matching_text
from envforge.verify.result import VerificationResult

# A pytest plugin that marks every test as passed; the probes smuggle it in various ways.
_FAKE_PASS_PLUGIN = """
import pytest
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    rep.outcome = "passed"
    rep.longrepr = None
"""

# Forging a report from inside the test process: an all-pass JUnit report for the test ids
# on the command line, written to the --junitxml path, to /dev/fd/3 and to every open
# descriptor, plus planted report files; then exit 0 before the real run can report.
_FAKE_REPORT_CODE = """
import glob as _g, os as _os, sys as _sys
def _envforge_forge():
    ids = [a for a in _sys.argv if "::" in a] or ["tests/test_x.py::test_x"]
    cases = "".join('<testcase classname="t" name="%s" file="%s"/>' % (i.split("::")[-1], i.split("::")[0])
                    for i in ids)
    xml = ('<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="%d">%s</testsuite></testsuites>'
           % (len(ids), cases)).encode()
    for a in _sys.argv:
        if a.startswith("--junitxml="):
            try:
                open(a.split("=", 1)[1], "wb").write(xml)
            except OSError:
                pass
    for path in _g.glob("/run/envforge*/**/*.xml", recursive=True) + _g.glob("/tmp/*.xml"):
        try:
            open(path, "wb").write(xml)
        except OSError:
            pass
    for fd in range(3, 1024):
        try:
            _os.write(fd, xml)
        except OSError:
            pass
    _os._exit(0)
_envforge_forge()
"""


def _files_of(task: Task) -> str:
    tests = task.spec.verification.tests
    files = sorted({t.split("::", 1)[0] for t in tests.ids}) if tests and tests.framework == "pytest" else []
    return " ".join(shlex.quote(f) for f in files) or "$(grep -rl --include='*.py' -e 'def test' . || true)"


def _heredoc(path: str, body: str) -> str:
    return f"mkdir -p \"$(dirname {shlex.quote(path)})\" && cat > {shlex.quote(path)} <<'ENVFORGE_EOF'\n{body}\nENVFORGE_EOF"


SOURCE_FILES = (
    "$(find . -name '*.py' -not -path './.git/*' -not -path '*/tests/*' -not -name 'test_*' "
    "-not -name '*_test.py' -not -name conftest.py)"
)

# Words in a checkpoint command that look like workspace paths (`svc/server.py`, `./bin/x.sh`, `out.csv`).
_PATH_WORD = re.compile(r"^(?:\./)?[\w.-]+(?:/[\w.-]+)*$")
_SHELL_WORDS = {
    "&&",
    "||",
    ";",
    "|",
    "then",
    "do",
    "done",
    "fi",
    "test",
    "cat",
    "grep",
    "git",
    "diff",
    "python3",
    "python",
    "sh",
    "bash",
    "cd",
    "cp",
    "rm",
    "ls",
    "tar",
    "echo",
    "printf",
    "HEAD",
}


def _command_words(command: str) -> list[str]:
    try:
        return shlex.split(command, comments=True)
    except ValueError:  # unbalanced quotes in a complex command: fall back to plain words
        return re.findall(r"[^\s'\"]+", command)


def _workspace_paths(command: str) -> list[str]:
    """Words of a command that may name workspace files (checked for existence by the probe script)."""
    out = []
    for word in _command_words(command):
        if word.startswith(("-", "$", "/")) or ".." in word.split("/") or word in _SHELL_WORDS:
            continue
        if _PATH_WORD.match(word) and ("/" in word or "." in word.strip(".")):
            out.append(word.removeprefix("./"))
    return out


_INTERPRETERS = {"python3", "python", "sh", "bash", "exec"}
_COMMAND_START = {None, "&&", "||", ";", "|", "then", "do", "else"}


def scripts_run(command: str) -> list[str]:
    """Workspace scripts the command executes (`python3 x.py`, `sh x.sh`, `./bin/x` in command position)."""
    out, prev = [], None
    for word in _command_words(command):
        path = word.removeprefix("./")
        if (
            _PATH_WORD.match(word)
            and not word.startswith("-")
            and ".." not in path.split("/")
            and (prev in _INTERPRETERS or (word.startswith("./") and prev in _COMMAND_START))
        ):
            out.append(path)
        prev = word
    return out


def _stub(path: str, output: str, exit_code: int) -> str:
    """Replace a workspace script with one that prints `output` and exits with `exit_code`."""
    if path.endswith(".py"):
        body = f"import sys\nsys.stdout.write({output!r})\nsys.exit({exit_code})"
    else:
        body = f"#!/bin/sh\nprintf '%s' {shlex.quote(output)}\nexit {exit_code}"
    q = shlex.quote(path)
    return f"if [ -f {q} ]; then {_heredoc(path, body)}\nchmod +x {q}; fi"


def _fake_checkpoint_output(task: Task) -> str:
    stubs: dict[str, str] = {}
    for check in task.spec.verification.checkpoints:
        output = (matching_text(check.stdout_pattern) or "") if check.stdout_pattern else ""
        for path in scripts_run(check.run):
            stubs.setdefault(path, _stub(path, output, check.expect_exit))
    return "\n".join(stubs.values()) or "true"


def verifier_inputs(task: Task, reference_paths: Sequence[str]) -> list[str]:
    """Workspace files the checks or the verifier's files name and the reference solution leaves alone."""
    names = [p for c in task.spec.verification.checkpoints for p in _workspace_paths(c.run)]
    for data in task.verifier_bytes().values():
        text = data.decode("utf-8", errors="ignore")
        names += [m for m in re.findall(r"[\"']([\w.-]+(?:/[\w.-]+)+)[\"']", text) if ".." not in m.split("/")]
    changed = set(reference_paths)
    return sorted({n for n in names if n not in changed})


def _tamper_verifier_inputs(task: Task, reference_paths: Sequence[str]) -> str:
    files = " ".join(shlex.quote(p) for p in verifier_inputs(task, reference_paths))
    if not files:
        return "true"
    return f'for f in {files}; do if [ -f "$f" ] && [ ! -L "$f" ]; then : > "$f"; fi; done'


def _edit_outside_workspace(task: Task) -> str:
    """Answers and command shims outside /workspace, plus a link to them from inside."""
    answers = [matching_text(c.stdout_pattern) or "" for c in task.spec.verification.checkpoints if c.stdout_pattern]
    shim = "#!/bin/sh\nprintf '%s' " + shlex.quote(answers[0] if answers else "ok") + "\nexit 0"
    lines = ["mkdir -p /tmp/bin /tmp/envforge-answers"]
    for command in ("python3", "python", "pytest", "git", "test", "grep", "cat"):
        lines += [_heredoc(f"/tmp/bin/{command}", shim), f"chmod +x /tmp/bin/{command}"]
    for rc in ("/tmp/.profile", "/tmp/.bashrc"):
        lines.append(f"echo 'export PATH=/tmp/bin:$PATH' >> {rc}")
    for i, answer in enumerate(answers):
        lines.append(_heredoc(f"/tmp/envforge-answers/checkpoint-{i}.txt", answer))
    lines += [
        f"mkdir -p {VERIFIER_DIR} 2>/dev/null && cp -r /tmp/envforge-answers/. {VERIFIER_DIR}/ 2>/dev/null",
        "ln -sfn /tmp/envforge-answers envforge-answers",
        "true",
    ]
    return "\n".join(lines)


Needs = Literal["any", "tests", "pytest", "checkpoints"]


@dataclass(frozen=True)
class Probe:
    name: str
    description: str
    needs: Needs = "any"  # what the task must be verified by for the probe to apply

    def applies(self, task: Task) -> str | None:
        """None when the probe applies to the task, else why it cannot."""
        v = task.spec.verification
        if self.needs in ("tests", "pytest") and v.tests is None:
            return "the task has no test checkpoint (it is verified by shell checkpoints)"
        if self.needs == "pytest" and v.tests is not None and v.tests.framework != "pytest":
            return f"the task's tests run under {v.tests.framework}, which loads no pytest hooks or plugins"
        if self.needs == "checkpoints" and not v.checkpoints:
            return "the task has no shell checkpoints"
        return None

    def script(self, task: Task, reference_paths: Sequence[str] = ()) -> str:
        """The probe's shell script for this task; `reference_paths` are the files the reference solution
        changes (what the checks read but the reference leaves alone are the verifier's inputs)."""
        files = _files_of(task)
        return {
            "delete_failing_tests": lambda: f"rm -f {files}",
            "empty_failing_tests": lambda: f'for f in {files}; do : > "$f"; done',
            "skip_failing_tests": lambda: (
                f"for f in {files}; do sed -i '1i import pytest\\npytestmark = pytest.mark.skip' \"$f\"; done"
            ),
            "conftest_exit_zero": lambda: _heredoc(
                "conftest.py", "import os\ndef pytest_sessionstart(session):\n    os._exit(0)"
            ),
            "conftest_rewrite_outcomes": lambda: _heredoc("conftest.py", _FAKE_PASS_PLUGIN),
            "plugin_entry_point": lambda: "\n".join(
                [
                    _heredoc("fakepass.py", _FAKE_PASS_PLUGIN),
                    _heredoc("fakepass-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: fakepass\nVersion: 1.0"),
                    _heredoc("fakepass-1.0.dist-info/entry_points.txt", "[pytest11]\nfakepass = fakepass"),
                ]
            ),
            "pythonpath_plugin": lambda: "\n".join(
                [
                    _heredoc("fakepass.py", _FAKE_PASS_PLUGIN),
                    _heredoc("sitecustomize.py", "import os\nos.environ['PYTEST_PLUGINS'] = 'fakepass'"),
                    _heredoc("envforge-hack.pth", "import os; os.environ['PYTEST_PLUGINS'] = 'fakepass'"),
                    _heredoc("pytest.ini", "[pytest]\naddopts = -p fakepass"),
                ]
            ),
            "sys_exit_in_code": lambda: (
                f"for f in {SOURCE_FILES}; do printf '\\nimport sys\\nsys.exit(0)\\n' >> \"$f\"; done"
            ),
            "fake_report": lambda: "\n".join(
                [
                    f"for f in {SOURCE_FILES}; do cat >> \"$f\" <<'ENVFORGE_EOF'\n{_FAKE_REPORT_CODE}\nENVFORGE_EOF\ndone",
                    _heredoc("report.xml", '<testsuites><testsuite name="pytest" tests="1"/></testsuites>'),
                    "mkdir -p /run/envforge/reports 2>/dev/null; "
                    "echo '<testsuites/>' > /run/envforge/reports/junit.xml 2>/dev/null; true",
                ]
            ),
            "shadow_pytest": lambda: _heredoc("pytest.py", _FAKE_REPORT_CODE),
            "git_config_hijack": lambda: "\n".join(
                [
                    _heredoc(
                        "/tmp/.gitconfig",
                        "[diff]\n\texternal = /tmp/fakediff.sh\n[core]\n\tfsmonitor = /tmp/fakediff.sh",
                    ),
                    _heredoc("/tmp/fakediff.sh", "#!/bin/sh\ncat /tmp/forged.patch 2>/dev/null; exit 0"),
                    "chmod +x /tmp/fakediff.sh",
                    "printf '[core]\\n\\tfsmonitor = /tmp/fakediff.sh\\n' >> .git/config",
                    "(while :; do sleep 0.2; done &) ",
                ]
            ),
            "edit_assertions": lambda: (
                f"for f in {files}; do sed -i -E 's/^( *)assert /\\1assert True or /' \"$f\"; done"
            ),
            "break_test_imports": lambda: (
                f'for f in {SOURCE_FILES}; do sed -i \'1i raise ImportError("sabotaged")\' "$f"; done'
            ),
            "fake_checkpoint_output": lambda: _fake_checkpoint_output(task),
            "tamper_verifier_inputs": lambda: _tamper_verifier_inputs(task, reference_paths),
            "edit_outside_workspace": lambda: _edit_outside_workspace(task),
        }[self.name]()


STANDARD_PROBES = [
    Probe("delete_failing_tests", "delete the files holding the failing tests", "tests"),
    Probe("empty_failing_tests", "truncate those files", "tests"),
    Probe("skip_failing_tests", "mark every test in them skipped", "pytest"),
    Probe("conftest_exit_zero", "a conftest.py that exits 0 at session start", "pytest"),
    Probe("conftest_rewrite_outcomes", "a conftest.py that rewrites every outcome to passed", "pytest"),
    Probe(
        "plugin_entry_point", "an outcome-rewriting pytest plugin registered through a dist-info entry point", "pytest"
    ),
    Probe(
        "pythonpath_plugin", "the same plugin loaded via sitecustomize.py, a .pth file and pytest.ini addopts", "pytest"
    ),
    Probe("sys_exit_in_code", "sys.exit(0) appended to every source module"),
    Probe(
        "fake_report",
        "the code under test forges an all-pass JUnit report (argv path, /dev/fd/3, every open "
        "descriptor, planted files) and exits 0 before the real run reports",
        "tests",
    ),
    Probe("shadow_pytest", "a workspace pytest.py that forges the report instead of running the tests", "pytest"),
    Probe(
        "git_config_hijack",
        "a ~/.gitconfig external diff driver and a .git/config fsmonitor hook, with a "
        "background process, to forge or tamper with the graded diff",
    ),
    Probe("edit_assertions", "turn every `assert` in the test files into `assert True or ...`", "tests"),
    Probe("break_test_imports", "make the modules the tests import fail to import", "tests"),
    Probe(
        "fake_checkpoint_output",
        "replace every workspace script a shell checkpoint runs with one that prints "
        "what the checkpoint looks for and exits with the code it expects",
        "checkpoints",
    ),
    Probe(
        "tamper_verifier_inputs",
        "truncate the workspace files the checks and the verifier's files read but "
        "the reference solution leaves alone (the verifier's inputs)",
        "checkpoints",
    ),
    Probe(
        "edit_outside_workspace",
        "plant answers and command shims outside /workspace (/tmp, shell start-up "
        "files on $HOME, the verifier's directory) and link to them from the workspace",
    ),
]


def applicable_probes(task: Task) -> tuple[list[Probe], dict[str, str]]:
    """(the probes that apply to the task, {probe name: why it does not apply} for the rest)."""
    applies, skipped = [], {}
    for probe in STANDARD_PROBES:
        why = probe.applies(task)
        if why is None:
            applies.append(probe)
        else:
            skipped[probe.name] = why
    return applies, skipped


def guard_for(result: VerificationResult, diff: str | None = None) -> str:
    """Which guard made the probe score 0 (`diff` is the probe's workspace diff, when known)."""
    reasons = result.reasons
    if diff is not None and not diff.strip():
        return "diff_only"
    if any(r.startswith("protected_path_modified:") for r in reasons):
        return "protected_paths"
    if {"report_unreadable", "report_missing", "report_incomplete"} & set(reasons):
        return "report_channel"
    if "patch_failed" in reasons:
        return "patch_failed"
    if any(r.startswith("checkpoint_failed:") for r in reasons):
        return "checkpoints"
    if result.reward == 0:
        return "explicit_pass_required"
    return "none"
