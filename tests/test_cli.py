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
from envforge.train.config import DEMO_TRAINING, TrainingConfig

ENVFORGE = str(Path(sys.executable).with_name("envforge"))


def run(args: list[str], data_dir: Path, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "ENVFORGE_DATA_DIR": str(data_dir)}
    proc = subprocess.run([ENVFORGE, *args], env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.parametrize("cmd", [[], ["ingest"], ["images"], ["images", "build"], ["catalog"], ["catalog", "list"],
                                 ["demo"], ["schema"], ["verify"], ["validate"], ["dedup"], ["dedup", "run"],
                                 ["dedup", "index"], ["dedup", "corpora"], ["dedup", "corpora", "add"], ["taskset"],
                                 ["taskset", "diff"], ["taskset", "lineage"],
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
    (specs / "runbooks").mkdir()
    (specs / "runbooks" / "notes.md").write_text("# Notes\n\nno front matter, so not a runbook\n")
    proc = run(["ingest", str(specs), "--json"], tmp_path / "data")
    doc = json.loads(proc.stdout)
    assert doc["valid"] == len(list(BUNDLED_SPECS.rglob("task.yaml"))) and doc["rejected"] >= 3
    assert [Path(s["source"]).name for s in doc["skipped"]] == ["notes.md"]  # reported, not silently ignored
    found = json.loads(run(["sources", "list", str(specs), "--json"], tmp_path / "data").stdout)
    assert [Path(s["source"]).name for s in found["skipped"]] == ["notes.md"]
    fields = {r["field"] for r in doc["rejects"] if r["source"].endswith("broken/task.yaml")}
    assert {"instruction", "max_turns", "verification", "reference_solution"} <= fields

    strict = run(["ingest", str(specs), "--json", "--strict"], tmp_path / "strict-data", check=False)
    assert strict.returncode == 64 and json.loads(strict.stdout)["written"] is False  # invalid input: EX_USAGE

    listing = json.loads(run(["catalog", "list", "--json"], tmp_path / "data").stdout)
    assert {r["task_id"] for r in listing} == {"inventory-median-even", "ops-service-config", "orders-daily-summary"}

    # a verdict with its verifier strength is listed with it
    from envforge.catalog import Catalog
    from envforge.config import Settings
    from envforge.verify.gate import GateReport
    from envforge.verify.strength import StrengthReport

    catalog = Catalog(Settings.from_env().with_data_dir(tmp_path / "data").catalog_path)
    task = next(t for t in catalog.load_tasks() if t.id == "inventory-median-even")
    catalog.record_validations([GateReport(task.id, task.content_hash, True, runs=1, reference_passes=1,
                                           strength=StrengthReport(strength=0.4, strength_upper=0.4),
                                           admission="audit")], {})
    listed = {r["task_id"]: r for r in json.loads(run(["catalog", "list", "--json"], tmp_path / "data").stdout)}
    assert listed["inventory-median-even"]["strength"] == 0.4 and listed["inventory-median-even"]["admission"] == "audit"
    assert listed["orders-daily-summary"]["strength"] is None


def test_dedup_corpora_index_parameters_and_runs(tmp_path):
    data = tmp_path / "data"
    run(["ingest", str(BUNDLED_SPECS)], data)
    once, kept = tmp_path / "once.jsonl", tmp_path / "kept.jsonl"
    for path, task in ((once, "inventory-median-even"), (kept, "orders-daily-summary")):
        leaked = (BUNDLED_SPECS / task / "task.yaml").read_text()
        path.write_text(json.dumps({"id": f"leak-{task}", "text": leaked}) + "\n")
    first = json.loads(run(["dedup", "run", "--corpus", f"once={once}", "--json"], data).stdout)
    status = {r["task_id"]: r for r in first["tasks"]}
    assert status["inventory-median-even"]["status"] == "contaminated"
    assert status["inventory-median-even"]["field"] == "instruction"
    assert status["inventory-median-even"]["evidence"]["evidence"][0]["doc_id"] == "leak-inventory-median-even"
    assert status["orders-daily-summary"]["reason"].startswith("clean")  # with its strongest evidence, or none
    assert "registered corpus kept" in run(["dedup", "corpora", "add", "kept", str(kept)], data).stdout
    listing = json.loads(run(["dedup", "corpora", "list", "--json"], data).stdout)
    assert [(r["name"], r["state"]) for r in listing] == [("humaneval", "indexed"), ("kept", "not indexed yet")]
    # Index parameters take a rebuild, and the refusal says how; decision thresholds do not.
    refused = run(["dedup", "index", "--candidate-threshold", "0.3"], data, check=False)
    assert refused.returncode == 64 and "envforge dedup index --rebuild --candidate-threshold 0.3" in refused.stderr
    second = json.loads(run(["dedup", "run", "--threshold", "0.3", "--json"], data).stdout)
    status = {r["task_id"]: r["status"] for r in second["tasks"]}
    # The one-run corpus is gone, the registered one applies, the lower threshold ran on the same index.
    assert status == {"inventory-median-even": "clean", "orders-daily-summary": "contaminated",
                      "ops-service-config": "clean"}
    assert second["sync"]["removed_files"] == [str(once.resolve())]
    assert any("below the LSH band" in w for w in second["warnings"])


def test_command_options_are_the_stage_configs_fields():
    """One definition per setting: each config field is an option of the command that runs the stage, with the
    field's default and help text; the command gets the config object built from them."""
    from typer.testing import CliRunner

    from envforge.cli import app
    from envforge.cli.options import build_config, config_fields
    from envforge.quality.params import DedupConfig, IndexConfig, SemanticConfig, WorkspaceScan
    from envforge.rollout.config import RolloutConfig
    from envforge.stages.configs import TierConfig
    from envforge.train.config import TrainingConfig
    from envforge.verify.config import GateConfig

    runner = CliRunner()
    for command, config in ((["train", "sft"], TrainingConfig), (["dedup", "run"], DedupConfig),
                            (["dedup", "index"], IndexConfig),
                            (["validate"], GateConfig), (["rollout"], RolloutConfig), (["tiers"], TierConfig)):
        text = runner.invoke(app, [*command, "--help"], terminal_width=240, env={"COLUMNS": "240"}).output
        for o in config_fields(config):  # nested configs flattened: DedupConfig.semantic.url is --semantic-url
            flags = o.field.metadata.get("cli") or (f"--{o.name.replace('_', '-')}",)
            assert flags[0] in text, (command, o.name)
    assert "--semantic-judge-model" in runner.invoke(app, ["dedup", "run", "--help"], terminal_width=240,
                                                     env={"COLUMNS": "240"}).output
    built = build_config(DedupConfig, {"threshold": 0.4, "semantic_url": "http://127.0.0.1:1/v1",
                                       "semantic_model": "m", "workspace_skip_dirs": ["vendor"]})
    assert built == DedupConfig(threshold=0.4, semantic=SemanticConfig(url="http://127.0.0.1:1/v1", model="m"),
                                workspace=WorkspaceScan(skip_dirs=("vendor",)))
    assert built.semantic.enabled and DedupConfig.from_params(built.as_params()["dedup"]) == built
    assert "GRPO sampling temperature" in runner.invoke(app, ["train", "rl", "--help"], terminal_width=240).output
    # a config's own check of its values is a usage error naming the field, not a traceback
    bad = runner.invoke(app, ["validate", "--workers", "0"], terminal_width=240)
    assert bad.exit_code == 64 and "GateConfig.workers: must be at least 1, got 0" in bad.output


def test_command_options_default_to_the_config_the_command_declares():
    """`config: TrainingConfig = DEMO_TRAINING`: every option defaults to the demo's value, and the options
    given override only their own fields (the learning demo's command is built this way)."""
    from dataclasses import replace

    import typer
    from typer.testing import CliRunner

    from envforge.cli import app
    from envforge.cli.options import config_options

    got: list[TrainingConfig] = []
    probe = typer.Typer()

    @probe.command()
    @config_options
    def run(config: TrainingConfig = DEMO_TRAINING) -> None:
        got.append(config)

    runner = CliRunner()
    assert runner.invoke(probe, [], catch_exceptions=False).exit_code == 0
    assert got[-1] == DEMO_TRAINING
    assert runner.invoke(probe, ["--rl-lr", "0.0002", "--rl-epochs-per-batch", "3"], catch_exceptions=False).exit_code == 0
    assert got[-1] == replace(DEMO_TRAINING, rl_lr=2e-4, rl_epochs_per_batch=3)
    text = runner.invoke(app, ["train", "demo", "--help"], terminal_width=240, env={"COLUMNS": "240"}).output
    assert "--rl-epochs-per-batch" in text and "--max-staleness" in text and "[default: 0.0005]" in text
