"""The sft, rl and evaluate stages on their own, tracked as every entry point calls them: a tiny model on
CPU, the bundled specs as a task set split two for training and one for evaluation, real sandboxes,
a real DuckDB catalog and MLflow store. What is asserted is what each stage records: checkpoint files,
catalog rows, MLflow params, metrics, tags and registered versions, and the promotion decision."""

from __future__ import annotations

import pytest

from envforge.catalog import Catalog
from envforge.config import Settings
from envforge.sources import load_specs
from envforge.stages.base import StageContext
from envforge.stages.evaluate import evaluate
from envforge.stages.images import ensure_images
from envforge.stages.rl import POLICY_MODEL, rl
from envforge.stages.sft import SFT_MODEL, sft
from envforge.train.checkpoint import read_trainer_state
from envforge.train.config import TrainingConfig
from envforge.train.registry import aliased_version, registry_client, version_for_checkpoint
from tests.conftest import BUNDLED_SPECS

pytestmark = pytest.mark.docker

CONFIG = TrainingConfig(base_model="tiny:64x2", sft_epochs=1, rl_rounds=1, group_size=2, tasks_per_round=0,
                        max_tokens=16, concurrency=4)


@pytest.fixture(scope="module")
def task_set(tmp_path_factory, docker_client):
    """(settings, version, images): the bundled specs as a task set whose recorded split is 2 train, 1 eval."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)  # the data directory's own store, read back below
        settings = Settings.from_env().with_data_dir(tmp_path_factory.mktemp("stages") / "data")
        settings.ensure_dirs()
        catalog = Catalog(settings.catalog_path)
        tasks = load_specs([BUNDLED_SPECS]).tasks
        catalog.ingest(load_specs([BUNDLED_SPECS]))
        assert len(tasks) >= 3
        tasks = sorted(tasks, key=lambda t: t.id)[:3]
        version = catalog.create_task_set("stages-training", tasks)
        catalog.record_tiers(version, [
            {"task_id": t.id, "content_hash": t.content_hash, "source": t.spec.source, "tier": "easy",
             "method": "static", "solved": 0, "k": 0, "score": 0.0, "split": split, "policy_id": ""}
            for t, split in zip(tasks, ("train", "train", "eval"))])
        images = ensure_images(settings, tasks, None, StageContext())
        yield settings, version, images


@pytest.fixture(scope="module")
def sft_run(task_set):
    settings, version, images = task_set
    return sft.tracked(settings, CONFIG, version, images)


@pytest.fixture(scope="module")
def rl_run(task_set, sft_run):
    settings, version, images = task_set
    return rl.tracked(settings, CONFIG, version, sft_run.checkpoint, images)


def _run(settings, run_id: str):
    return registry_client(settings).get_run(run_id)


def test_sft_saves_a_checkpoint_and_records_run_and_version(task_set, sft_run):
    settings, version, _ = task_set
    assert sft_run.checkpoint == settings.checkpoint_dir("sft", version).resolve()
    assert (sft_run.checkpoint / "config.json").is_file() and list(sft_run.checkpoint.glob("*.safetensors"))
    assert (sft_run.train_tasks, sft_run.eval_tasks) == (2, 1) and sft_run.chart.is_file()
    assert sft_run.result.total_steps > 0 and sft_run.result.losses
    run = _run(settings, sft_run.mlflow_run_id)
    assert run.data.tags["envforge.stage"] == "sft"
    assert run.data.params["task_set_version"] == version and run.data.params["base_model"] == CONFIG.base_model
    assert [m.step for m in registry_client(settings).get_metric_history(run.info.run_id, "sft_loss")]
    registered = version_for_checkpoint(settings, SFT_MODEL, sft_run.checkpoint)
    assert registered is not None and registered.tags["task_set_version"] == version
    assert registered.tags["start_checkpoint"] == CONFIG.base_model
    extra = read_trainer_state(sft_run.checkpoint)["extra"]
    assert extra["task_set_version"] == version and extra["lineage"]["stage"] == "sft"
    # the teacher's demonstrations are rollout batches of the task set, in the catalog
    batches = Catalog(settings.catalog_path).rollout_batches()
    demo_batches = set(sft_run.lineage["rollout_batches"].split(","))
    recorded = batches.filter(batches["batch_id"].is_in(list(demo_batches)))
    assert set(recorded["batch_id"]) == demo_batches and set(recorded["task_set_version"]) == {version}


def test_rl_trains_from_the_sft_checkpoint_and_registers_without_moving_best(task_set, sft_run, rl_run):
    settings, version, _ = task_set
    assert rl_run.checkpoint == settings.checkpoint_dir("rl", version).resolve() and rl_run.start == sft_run.checkpoint
    assert list(rl_run.checkpoint.glob("*.safetensors"))
    assert len(rl_run.history) == CONFIG.rl_rounds and len(rl_run.batch_ids) == CONFIG.rl_rounds
    assert 0.0 <= rl_run.history[0]["rollout_mean_reward"] <= 1.0
    batches = Catalog(settings.catalog_path).rollout_batches()
    rounds = batches.filter(batches["batch_id"].is_in(rl_run.batch_ids))
    assert len(rounds) == CONFIG.rl_rounds and set(rounds["task_set_version"]) == {version}
    # every train task, group_size samples each (tasks_per_round=0: every task every round)
    assert rounds["n_tasks"].to_list() == [2] and rounds["n_samples"].to_list() == [CONFIG.group_size]
    run = _run(settings, rl_run.mlflow_run_id)
    assert run.data.tags["envforge.stage"] == "rl" and run.data.params["from"] == str(sft_run.checkpoint)
    assert registry_client(settings).get_metric_history(run.info.run_id, "rollout_mean_reward")
    registered = version_for_checkpoint(settings, POLICY_MODEL, rl_run.checkpoint)
    assert registered is not None and registered.tags["rollout_batches"] == ",".join(rl_run.batch_ids)
    assert aliased_version(settings, POLICY_MODEL) is None  # only the evaluation moves `best`


def test_evaluate_measures_each_phase_and_promotes_the_rl_checkpoint(task_set, sft_run, rl_run):
    settings, version, images = task_set
    checkpoints = {"after SFT": sft_run.checkpoint, "after RL": rl_run.checkpoint}
    result = evaluate.tracked(settings, CONFIG, version, checkpoints, images)
    report = result.report
    assert report["task_set_version"] == version and report["eval_tasks"] == 1
    assert list(report["phases"]) == ["before", "after SFT", "after RL"]
    assert result.phases == {"before": CONFIG.base_model, "after SFT": str(sft_run.checkpoint),
                             "after RL": str(rl_run.checkpoint)}
    for phase in report["phases"].values():
        assert phase["pass_at_1"] in (0.0, 1.0)  # one eval task, greedy
        assert set(phase["by_tier"]) == {"easy"} and phase["batch_id"]
    assert all(path.is_file() for path in result.charts_by.values()) and set(result.charts_by) == {"by_tier",
                                                                                                 "by_source"}
    # no `best` before: the RL checkpoint is promoted on its eval-split score
    assert report["promotion"]["promoted"]
    best = aliased_version(settings, POLICY_MODEL)
    assert best is not None and best.version == version_for_checkpoint(settings, POLICY_MODEL,
                                                                       rl_run.checkpoint).version
    run = _run(settings, result.mlflow_run_id)
    assert run.data.tags["envforge.stage"] == "evaluation"
    assert run.data.metrics == pytest.approx(result.metrics()) and set(result.metrics()) == {
        "pass_at_1_before", "pass_at_1_after_SFT", "pass_at_1_after_RL"}
    batches = Catalog(settings.catalog_path).rollout_batches()
    assert {p["batch_id"] for p in report["phases"].values()} <= set(batches["batch_id"])
