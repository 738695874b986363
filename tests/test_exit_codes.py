"""Exit codes that mean one thing (cli/exit_codes.py, the README's table): a usage or validation error
exits 64 from every command, never 2, which means "infrastructure fault, retry"; a real infrastructure
fault still exits 2 and a solution that does not resolve still exits 1."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import typer.main
from typer.testing import CliRunner

from envforge.cli import app
from envforge.cli.exit_codes import ExitCode, for_exception
from envforge.errors import BatchRejectedError, EnvforgeError, InfraError, InvalidValue, Problem, SpecError
from tests.conftest import BUNDLED_SPECS, REPO

SPEC = str(BUNDLED_SPECS / "inventory-median-even")
runner = CliRunner()


def _leaf_commands(group=None, path=()) -> list[tuple[str, ...]]:
    group = group or typer.main.get_command(app)
    out: list[tuple[str, ...]] = []
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            out += _leaf_commands(cmd, (*path, name))
        else:
            out.append((*path, name))
    return out


COMMANDS = _leaf_commands()


def test_the_table_has_one_meaning_per_code():
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3, 64]
    assert for_exception(InfraError("engine_unreachable")) == ExitCode.INFRA
    assert for_exception(SpecError([Problem("task.yaml", "max_turns", "not an integer")])) == ExitCode.USAGE
    assert for_exception(BatchRejectedError([Problem("a.jsonl:3", "", "bad")])) == ExitCode.USAGE
    assert for_exception(InvalidValue("tenant 'X'")) == ExitCode.USAGE
    assert for_exception(FileNotFoundError(2, "No such file", "/nope")) == ExitCode.USAGE
    assert for_exception(EnvforgeError("an image build failed")) == ExitCode.NO
    assert for_exception(PermissionError(13, "denied")) == ExitCode.NO


def test_the_readme_documents_the_table():
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("### Exit codes"):]
    rows = dict(re.findall(r"^\| (\d+) \| (.+?) \|$", section, re.M))
    assert [int(c) for c in rows] == [int(c) for c in ExitCode], rows
    assert "usage" in rows["64"] and "infrastructure" in rows["2"] and "not resolved" in rows["1"]


def test_every_command_is_reached():
    assert len(COMMANDS) > 40
    assert {("verify",), ("rollout",), ("validate",), ("ingest",), ("service", "keys", "create")} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_an_unknown_option_exits_64_from_every_command(command):
    result = runner.invoke(app, [*command, "--no-such-flag"])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "No such option" in result.output and "--no-such-flag" in result.output


@pytest.mark.parametrize("args,says", [
    ([], "Usage"),  # no command at all
    (["no-such-command"], "No such command"),
    (["verify"], "Missing option"),
    (["rollout", "-n", "many"], "Invalid value for '--samples'"),
    (["rollout", "--max-dropped-fraction", "lots"], "Invalid value for '--max-dropped-fraction'"),
    (["validate", "--workers", "0"], "GateConfig.workers: must be at least 1, got 0"),  # a config's own check
    (["verify", "--task", SPEC], "give exactly one of --patch FILE or --commands FILE"),
    (["rollout-export", "b", "out.parquet"], "no rollout batch 'b'"),
    (["train", "demo", "--seeds", "one,two"], "expected comma-separated integers"),
])
def test_a_bad_value_exits_64(args, says, tmp_path):
    result = runner.invoke(app, [*args, *(["--data-dir", str(tmp_path)] if args[:1] == ["rollout-export"] else [])],
                           terminal_width=240, env={"COLUMNS": "240"})
    assert result.exit_code == ExitCode.USAGE, result.output
    assert says in result.output, result.output


def test_a_bad_file_exits_64(tmp_path, allow_tmp_sources):
    broken = tmp_path / "specs" / "broken"
    broken.mkdir(parents=True)
    (broken / "task.yaml").write_text("id: broken-task\ninstruction: short\nmax_turns: lots\n")
    patch = tmp_path / "fix.patch"
    patch.write_text("--- a/x\n+++ b/x\n")
    data = ["--data-dir", str(tmp_path / "data")]

    spec = runner.invoke(app, ["verify", "--task", str(broken), "--patch", str(patch), *data], terminal_width=240)
    assert spec.exit_code == ExitCode.USAGE and "max_turns" in spec.output, spec.output
    missing = runner.invoke(app, ["verify", "--task", SPEC, "--patch", str(tmp_path / "nope.patch"), *data])
    assert missing.exit_code == ExitCode.USAGE and "nope.patch" in missing.output, missing.output
    strict = runner.invoke(app, ["ingest", str(tmp_path / "specs"), "--strict", "--json", *data])
    assert strict.exit_code == ExitCode.USAGE and '"written": false' in strict.output, strict.output
    setting = subprocess.run([sys.executable, "-m", "envforge.cli", "config", "show"], capture_output=True, text=True,
                             env={**os.environ, "ENVFORGE_SERVICE_PORT": "eighty"}, timeout=120)
    assert setting.returncode == ExitCode.USAGE and "ENVFORGE_SERVICE_PORT" in setting.stderr


def test_a_typo_through_the_console_script_exits_64_not_2():
    """What the issue saw: `envforge verify --no-such-flag` exited 2, so a script retried it forever."""
    proc = subprocess.run([sys.executable, "-m", "envforge.cli", "verify", "--no-such-flag"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 64 and "No such option" in proc.stderr


def test_an_engine_that_does_not_answer_is_still_an_infrastructure_fault(tmp_path):
    patch = tmp_path / "fix.patch"
    patch.write_text("--- a/x\n+++ b/x\n")
    proc = subprocess.run([sys.executable, "-m", "envforge.cli", "verify", "--task", SPEC, "--patch", str(patch),
                           "--json", "--data-dir", str(tmp_path / "data")], capture_output=True, text=True,
                          env={**os.environ, "DOCKER_HOST": "tcp://127.0.0.1:1"}, timeout=300)
    assert proc.returncode == ExitCode.INFRA, proc.stderr[-2000:]
