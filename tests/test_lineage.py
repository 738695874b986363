"""Registry and lineage: `best` moves only on eval-split evidence; `envforge lineage` walks a checkpoint back
to its task set's source records. Real MLflow (SQLite store) and a real DuckDB catalog; no training."""

from __future__ import annotations

import json
import os

import pytest

from envforge import track
from envforge.catalog import Catalog
from envforge.sources import load_specs
from envforge.train.checkpoint import log_checkpoint, save_checkpoint
from envforge.train.registry import aliased_version, eval_tag, promote_if_better
from tests.conftest import BUNDLED_SPECS


@pytest.fixture
def tracked(settings, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return settings


def _checkpoint(settings, tiny, name: str, lineage: dict, model: str, tags: dict, dagster: str = ""):
    path = save_checkpoint(settings.data_dir / "checkpoints" / name, *tiny, extra={"lineage": lineage})
    with track.mlflow_run(settings, name, "train", dagster_run_id=dagster or None):
        version = log_checkpoint(path, {"x": 1.0}, model, tags=tags)
    return path, version


@pytest.fixture(scope="module")
def tiny():
    from envforge.rollout.policies.tiny import TinyModelConfig, build_tiny_model

    return build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, heads=2, kv_heads=1, intermediate=64))


def test_best_moves_only_when_the_eval_split_says_so(tracked, tiny):
    settings = tracked
    a, _ = _checkpoint(settings, tiny, "rl-a", {}, "pol", {"task_set_version": "ts1"})
    assert aliased_version(settings, "pol") is None  # registering never moves best
    first = promote_if_better(settings, "pol", a, 0.5, "ts1", measure=lambda p: pytest.fail("nothing to measure"))
    assert first["promoted"] and str(aliased_version(settings, "pol").version) == "1"

    b, _ = _checkpoint(settings, tiny, "rl-b", {}, "pol", {"task_set_version": "ts1"})
    worse = promote_if_better(settings, "pol", b, 0.5, "ts1", measure=lambda p: pytest.fail("best has a score"))
    assert not worse["promoted"] and worse["previous_score"] == 0.5 and str(aliased_version(settings, "pol").version) == "1"

    # on another eval split the holder has no score yet: it is measured (from its registered artifacts)
    measured = []
    c, _ = _checkpoint(settings, tiny, "rl-c", {}, "pol", {"task_set_version": "ts2"})
    better = promote_if_better(settings, "pol", c, 0.75, "ts2", measure=lambda p: measured.append(p) or 0.25)
    assert better["promoted"] and better["previous_score"] == 0.25 and os.path.isdir(measured[0])
    best = aliased_version(settings, "pol")
    assert str(best.version) == "3" and best.tags[eval_tag("ts2")] == "0.75" and best.tags["promoted"] == "true"


def test_lineage_walks_back_to_the_source_records(tracked, tiny):
    settings = tracked
    catalog = Catalog(settings.catalog_path)
    loaded = load_specs([BUNDLED_SPECS])
    catalog.ingest(loaded)
    version = catalog.create_task_set("lineage-test", loaded.tasks[:3])
    catalog.record_rollout_batch({"batch_id": "rl-round-0", "task_set_version": version, "policy_id": "p",
                                  "location": "/x/rl-round-0", "n_tasks": 3, "n_samples": 2, "n_trajectories": 6,
                                  "n_dropped_groups": 0, "pass_at_1": 0.5, "metrics_json": "{}"})
    sft, _ = _checkpoint(settings, tiny, "sft-x", {"stage": "sft", "task_set_version": version,
                                                   "start_checkpoint": "tiny:32x1"}, "pol-sft",
                         {"task_set_version": version, "start_checkpoint": "tiny:32x1",
                          "rollout_batches": "sft-teacher"})
    rl, _ = _checkpoint(settings, tiny, "rl-x", {"stage": "rl"}, "pol",
                        {"task_set_version": version, "start_checkpoint": str(sft), "rollout_batches": "rl-round-0"},
                        dagster="dagster-run-1")
    from typer.testing import CliRunner

    from envforge.cli import app

    def lineage(*args: str):
        return CliRunner().invoke(app, ["lineage", *args, "--data-dir", str(settings.data_dir)])

    proc = lineage(str(rl), "--json")
    assert proc.exit_code == 0, proc.output[-2000:]
    node = json.loads(proc.stdout)
    assert node["registered"]["model"] == "pol" and node["dagster_run_id"] == "dagster-run-1" and node["mlflow_run_id"]
    assert node["rollout_batches"][0]["n_trajectories"] == 6
    assert node["task_set"]["version"] == version and node["task_set"]["tasks"] == 3
    assert {s["kind"] for s in node["task_set"]["source_records"]} and all(s["key"] for s in
                                                                           node["task_set"]["source_records"])
    sft_node = node["from"]
    assert sft_node["registered"]["model"] == "pol-sft" and sft_node["from"] == {"base_model": "tiny:32x1"}
    assert sft_node["rollout_batches"][0]["missing"]  # named, but not in this catalog
    text = lineage("pol/1")
    assert text.exit_code == 0 and "registered pol v1" in text.output and "base model tiny:32x1" in text.output
    bad = lineage("nope")
    assert bad.exit_code == 64 and "expected a checkpoint directory" in bad.output
