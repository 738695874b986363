"""The `envforge` command as a user runs it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BUNDLED_SPECS

ENVFORGE = str(Path(sys.executable).with_name("envforge"))


def run(args: list[str], data_dir: Path, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "ENVFORGE_DATA_DIR": str(data_dir)}
    proc = subprocess.run([ENVFORGE, *args], env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.parametrize("cmd", [[], ["ingest"], ["images"], ["images", "build"], ["catalog"], ["catalog", "list"],
                                 ["demo"], ["schema"], ["verify"], ["validate"], ["dedup"], ["dedup", "run"],
                                 ["dedup", "index"], ["taskset"], ["taskset", "diff"], ["taskset", "lineage"],
                                 ["train", "sft"], ["train", "rl"], ["train", "evaluate"], ["rollout"], ["tiers"]])
def test_help_everywhere(cmd, tmp_path):
    proc = run([*cmd, "--help"], tmp_path)
    assert "Usage" in proc.stdout


def test_ingest_json_reports_valid_and_rejects(tmp_path):
    specs = tmp_path / "specs"
    shutil.copytree(BUNDLED_SPECS, specs)
    bad = specs / "broken"
    bad.mkdir()
    (bad / "task.yaml").write_text("id: broken-task\ninstruction: short\nmax_turns: lots\n")
    proc = run(["ingest", str(specs), "--json"], tmp_path / "data")
    doc = json.loads(proc.stdout)
    assert doc["valid"] == len(list(BUNDLED_SPECS.rglob("task.yaml"))) and doc["rejected"] >= 3
    fields = {r["field"] for r in doc["rejects"] if r["source"].endswith("broken/task.yaml")}
    assert {"instruction", "max_turns", "verification", "reference_solution"} <= fields

    strict = run(["ingest", str(specs), "--json", "--strict"], tmp_path / "strict-data", check=False)
    assert strict.returncode == 1 and json.loads(strict.stdout)["written"] is False

    listing = json.loads(run(["catalog", "list", "--json"], tmp_path / "data").stdout)
    assert {r["task_id"] for r in listing} == {"inventory-median-even", "ops-service-config", "orders-daily-summary"}


def test_dedup_run_and_index_with_a_user_corpus(tmp_path):
    data = tmp_path / "data"
    run(["ingest", str(BUNDLED_SPECS)], data)
    corpus = tmp_path / "corpus.jsonl"
    leaked = (BUNDLED_SPECS / "orders-daily-summary" / "task.yaml").read_text()
    corpus.write_text(json.dumps({"id": "leak-1", "text": leaked}) + "\n")
    built = run(["dedup", "index", "--corpus", f"private={corpus}"], data)
    assert "165 documents" in built.stdout  # HumanEval's 164 + ours
    again = run(["dedup", "index", "--corpus", f"private={corpus}"], data)
    assert "+0 from 0 new" in again.stdout
    doc = json.loads(run(["dedup", "run", "--corpus", f"private={corpus}", "--json"], data).stdout)
    status = {r["task_id"]: r for r in doc["tasks"]}
    assert status["orders-daily-summary"]["status"] == "contaminated"
    assert status["orders-daily-summary"]["doc_id"] == "leak-1"
    assert status["inventory-median-even"]["status"] == "clean"


def test_command_options_are_the_stage_configs_fields():
    """One definition per setting: each config field is an option of the command that runs the stage, with the
    field's default and help text; the command gets the config object built from them."""
    from dataclasses import fields

    from typer.testing import CliRunner

    from envforge.cli import app
    from envforge.quality.params import DedupConfig
    from envforge.rollout.config import RolloutConfig
    from envforge.stages.configs import TierConfig
    from envforge.train.config import TrainingConfig
    from envforge.verify.config import GateConfig

    runner = CliRunner()
    for command, config in ((["train", "sft"], TrainingConfig), (["dedup", "run"], DedupConfig),
                            (["validate"], GateConfig), (["rollout"], RolloutConfig), (["tiers"], TierConfig)):
        text = runner.invoke(app, [*command, "--help"], terminal_width=240, env={"COLUMNS": "240"}).output
        for f in fields(config):
            flags = f.metadata.get("cli") or (f"--{f.name.replace('_', '-')}",)
            assert flags[0] in text, (command, f.name)
    assert "GRPO sampling temperature" in runner.invoke(app, ["train", "rl", "--help"], terminal_width=240).output
    # a config's own check of its values is a usage error naming the field, not a traceback
    bad = runner.invoke(app, ["validate", "--workers", "0"], terminal_width=240)
    assert bad.exit_code == 2 and "GateConfig.workers: must be at least 1, got 0" in bad.output
