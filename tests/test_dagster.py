"""The Dagster code location: it loads, validates, and materializes its assets in-process."""

from __future__ import annotations

import os
import subprocess
import sys

import dagster as dg
import mlflow
import pytest

from assets.defs.environments.assets import environment_images
from assets.defs.environments.checks import environment_images_complete
from assets.defs.resources import default_resources
from assets.defs.sources.assets import candidate_tasks, source_assets
from assets.defs.quality.assets import contamination_report, decontaminated_tasks
from assets.defs.quality.checks import no_contaminated_task_remains, splits_leak_free
from assets.defs.sources.checks import candidate_tasks_schema, reject_rate_checks
from assets.defs.verification.assets import validated_tasks
from assets.defs.verification.checks import quarantine_rate
from tests.conftest import REPO


def test_definitions_validate_cli(tmp_path):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dh"), "ENVFORGE_DATA_DIR": str(tmp_path / "data")}
    (tmp_path / "dh").mkdir()
    dagster = os.path.join(os.path.dirname(sys.executable), "dagster")
    proc = subprocess.run([dagster, "definitions", "validate", "-w", "workspace.yaml"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "All code locations passed validation" in proc.stderr + proc.stdout


def test_definitions_object():
    from assets.definitions import defs

    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert {"spec_tasks", "runbook_tasks", "ticket_tasks", "review_tasks", "swebench_tasks", "candidate_tasks",
            "decontaminated_tasks", "contamination_report", "environment_images", "validated_tasks"} <= keys
    assert defs.resolve_job_def("main_job") is not None
    for kind in ("spec", "runbook", "ticket", "review", "swebench"):
        assert defs.resolve_job_def(f"ingest_{kind}_sources").partitions_def.name == f"{kind}_sources"
    assert defs.resolve_sensor_def("task_sources_sensor") is not None


def materialize_sources(instance, resources, roots, kinds=("spec", "runbook")):
    """Register the sources under the roots as partitions and materialize each one, as the sensor would."""
    from envforge.sources import discover_sources

    refs, _ = discover_sources(roots)
    assets = {a.key.to_user_string().removesuffix("_tasks"): a for a in source_assets}
    checks = {c.check_key.asset_key.to_user_string().removesuffix("_tasks"): c for c in reject_rate_checks}
    results = []
    for ref in (r for r in refs if r.kind in kinds):
        key = ref.key(REPO / "task_sources")
        instance.add_dynamic_partitions(f"{ref.kind}_sources", [key])
        results.append(dg.materialize([assets[ref.kind], checks[ref.kind]], partition_key=key, instance=instance,
                                      resources=resources))
    return results


@pytest.mark.docker
def test_materialize_first_assets_in_process(settings, docker_client):
    instance = dg.DagsterInstance.ephemeral()
    sources = materialize_sources(instance, default_resources(settings),
                                  [REPO / "task_sources" / "specs", REPO / "task_sources" / "runbooks"])
    assert all(r.success for r in sources)
    source_md = [e.materialization.metadata for r in sources for e in r.get_asset_materialization_events()]
    assert sum(md["valid"].value for md in source_md) == 8 and len(source_md) == 9  # + the bad runbook
    assert all(e.passed for r in sources for e in r.get_asset_check_evaluations())
    result = dg.materialize(
        [candidate_tasks, decontaminated_tasks, contamination_report, environment_images, validated_tasks,
         candidate_tasks_schema, no_contaminated_task_remains, splits_leak_free, environment_images_complete,
         quarantine_rate],
        resources=default_resources(settings), instance=instance,
        run_config={"ops": {"validated_tasks": {"config": {"runs": 1, "shuffle": False, "probes": True}}}},
    )
    assert result.success
    checks = {e.asset_check_key.name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks == {"candidate_tasks_schema": True, "environment_images_complete": True, "quarantine_rate": True,
                      "no_contaminated_task_remains": True, "splits_leak_free": True}
    quality_md = result.asset_materializations_for_node("decontaminated_tasks")[0].metadata
    assert quality_md["clean"].value == 8 and quality_md["contaminated"].value == 0
    assert quality_md["index_docs_added"].value == 164  # HumanEval, indexed once
    gate_md = result.asset_materializations_for_node("validated_tasks")[0].metadata
    assert gate_md["accepted"].value == 8 and gate_md["quarantined"].value == 0
    assert gate_md["chart"].value.startswith("![flake_report.png](data:image/png;base64,")
    candidates_md = result.asset_materializations_for_node("candidate_tasks")[0].metadata
    assert candidates_md["tasks"].value == 8 and candidates_md["by_kind"].value["runbook"] == 5
    images_md = result.asset_materializations_for_node("environment_images")[0].metadata
    assert set(images_md["images"].value) >= {"inventory-median-even", "ops-service-config", "orders-daily-summary"}
    # Each materialization logged an MLflow run tagged with the Dagster run id.
    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
    runs = mlflow.search_runs(experiment_names=[settings.mlflow_experiment],
                              filter_string=f"tags.`dagster.run_id` = '{result.run_id}'", output_format="list")
    assert {r.data.tags["envforge.stage"] for r in runs} == {"quality", "images", "validate"}
    for source_run in sources:  # each source partition's ingest is its own Dagster run, tracked too
        tagged = mlflow.search_runs(experiment_names=[settings.mlflow_experiment], output_format="list",
                                    filter_string=f"tags.`dagster.run_id` = '{source_run.run_id}'")
        assert [r.data.tags["envforge.stage"] for r in tagged] == ["ingest"]
    # Rollouts: the tiered task set registers its version as a partition; one batch per (version, policy).
    from assets.defs.rollouts.assets import rollout_batch, tiered_task_set
    from assets.defs.rollouts.checks import rollout_infra_failure_rate, tiers_complete

    tiered = dg.materialize([tiered_task_set, tiers_complete], resources=default_resources(settings),
                            instance=instance)
    assert tiered.success
    tier_md = tiered.asset_materializations_for_node("tiered_task_set")[0].metadata
    assert tier_md["tasks"].value == 8 and tier_md["method"].value == "static"
    assert tier_md["histogram"].value.startswith("![tiers-")
    assert [e.passed for e in tiered.get_asset_check_evaluations()] == [True]
    key = tier_md["partition_key"].value
    assert instance.get_dynamic_partitions("task_set_versions") == [key]
    assert instance.get_dynamic_partitions("rollout_policies") == ["replay"]
    batch = dg.materialize([rollout_batch, rollout_infra_failure_rate], resources=default_resources(settings),
                           instance=instance, partition_key=dg.MultiPartitionKey({"task_set": key, "policy": "replay"}),
                           run_config={"ops": {"rollout_batch": {"config": {"samples": 2, "concurrency": 4}}}})
    assert batch.success
    batch_md = batch.asset_materializations_for_node("rollout_batch")[0].metadata
    assert batch_md["trajectories"].value == 16 and batch_md["pass_at_1"].value == 1.0
    assert [e.passed for e in batch.get_asset_check_evaluations()] == [True]
    tagged = mlflow.search_runs(experiment_names=[settings.mlflow_experiment], output_format="list",
                                filter_string=f"tags.`dagster.run_id` = '{batch.run_id}'")
    [rollout_run] = tagged
    assert rollout_run.data.metrics["pass_at_1"] == 1.0 and "steps_per_s" in rollout_run.data.metrics
    # Training on the tiered set: SFT -> GRPO -> evaluation, each a tracked, registered checkpoint.
    from assets.defs.training.assets import evaluation_report, rl_checkpoint, sft_checkpoint

    trained = dg.materialize(
        [sft_checkpoint, rl_checkpoint, evaluation_report], resources=default_resources(settings), instance=instance,
        run_config={"ops": {"sft_checkpoint": {"config": {"epochs": 2}},
                            "rl_checkpoint": {"config": {"rounds": 1, "group_size": 2}}}})
    assert trained.success
    sft_md = trained.asset_materializations_for_node("sft_checkpoint")[0].metadata
    assert sft_md["steps"].value > 0 and sft_md["final_loss"].value < sft_md["first_loss"].value
    rl_md = trained.asset_materializations_for_node("rl_checkpoint")[0].metadata
    assert rl_md["rounds"].value == 1 and (settings.data_dir / "checkpoints").is_dir()
    eval_md = trained.asset_materializations_for_node("evaluation_report")[0].metadata
    assert set(eval_md["pass_at_1"].value) == {"before", "after SFT", "after RL"}
    assert eval_md["by_tier"].value.startswith("![evaluation-by_tier")
    versions = mlflow.MlflowClient().search_model_versions("name='envforge-policy'")
    assert versions and mlflow.MlflowClient().get_model_version_by_alias("envforge-policy", "best")


def test_task_sources_sensor_requests_the_affected_partitions(tmp_path, monkeypatch):
    """Sensor ticks in-process: every source is new on the first tick, nothing on an idle tick,
    exactly the edited source after an edit, and a deleted source's partition is dropped."""
    import json
    import shutil

    from assets.definitions import defs
    from assets.defs.sources.sensors import task_sources_sensor

    root = tmp_path / "task_sources"
    shutil.copytree(REPO / "task_sources" / "runbooks", root / "runbooks")
    shutil.copytree(REPO / "task_sources" / "specs" / "ops-service-config", root / "specs" / "ops-service-config")
    shutil.copytree(REPO / "task_sources" / "specs", root / "examples")  # examples/ are not watched
    monkeypatch.setenv("ENVFORGE_TASK_SOURCES", str(root))
    monkeypatch.setenv("ENVFORGE_DATA_DIR", str(tmp_path / "data"))
    instance = dg.DagsterInstance.ephemeral()

    def tick(cursor=None):
        return task_sources_sensor(dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs))

    first = tick()
    runbooks = sorted(f"runbooks/{p.name}" for p in (root / "runbooks").glob("*.md"))
    assert sorted(r.partition_key for r in first.run_requests) == sorted(runbooks + ["specs/ops-service-config/task.yaml"])
    assert {r.job_name for r in first.run_requests} == {"ingest_runbook_sources", "ingest_spec_sources"}
    added = {req.partitions_def_name: sorted(req.partition_keys) for req in first.dynamic_partitions_requests}
    assert added == {"runbook_sources": runbooks, "spec_sources": ["specs/ops-service-config/task.yaml"]}

    idle = tick(first.cursor)
    assert idle.run_requests == [] and idle.dynamic_partitions_requests == []

    edited = root / "runbooks" / "log-rotation.md"
    edited.write_text(edited.read_text().replace("Rotate", "Please rotate", 1) + "\n")
    (root / "specs" / "ops-service-config" / "task.yaml").write_text(
        (root / "specs" / "ops-service-config" / "task.yaml").read_text() + "\n# touched\n")
    (root / "runbooks" / "cron-backup.md").unlink()
    after = tick(idle.cursor)
    assert sorted(r.partition_key for r in after.run_requests) == ["runbooks/log-rotation.md",
                                                                    "specs/ops-service-config/task.yaml"]
    [delete] = after.dynamic_partitions_requests
    assert delete.partitions_def_name == "runbook_sources" and list(delete.partition_keys) == ["runbooks/cron-backup.md"]
    assert "runbooks/cron-backup.md" not in json.loads(after.cursor)

    # The requested run really ingests that partition.
    instance.add_dynamic_partitions("runbook_sources", ["runbooks/log-rotation.md"])
    job = defs.resolve_job_def("ingest_runbook_sources")
    from envforge.config import Settings
    run = job.execute_in_process(partition_key="runbooks/log-rotation.md", instance=instance,
                                 resources=default_resources(Settings.from_env()))
    assert run.success
    [event] = run.get_asset_materialization_events()
    assert event.materialization.metadata["valid"].value == 1


def test_nightly_schedule_requests_a_full_refresh_with_a_valid_run_config():
    """The schedule is on by default, fires at 02:00 UTC, and asks for the refresh job with reingest on."""
    from datetime import datetime, timezone

    from assets.definitions import defs

    schedule = defs.resolve_schedule_def("nightly_refresh")
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING and schedule.cron_schedule == "0 2 * * *"
    context = dg.build_schedule_context(scheduled_execution_time=datetime(2026, 11, 30, 2, 0, tzinfo=timezone.utc))
    [request] = schedule.evaluate_tick(context).run_requests
    assert request.run_config == {"ops": {"candidate_tasks": {"config": {"reingest": True}}}}
    job = defs.resolve_job_def(request.job_name or schedule.job_name)
    assert job.name == "nightly_refresh_job"
    keys = {k.to_user_string() for k in job.asset_layer.executable_asset_keys}
    assert {"candidate_tasks", "decontaminated_tasks", "environment_images", "validated_tasks",
            "tiered_task_set"} <= keys
    assert not keys & {"rollout_batch", "sft_checkpoint", "spec_tasks"}
    assert dg.validate_run_config(job, request.run_config)
