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
from assets.defs.quality.checks import no_contaminated_task_remains
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
         candidate_tasks_schema, no_contaminated_task_remains, environment_images_complete, quarantine_rate],
        resources=default_resources(settings), instance=instance,
        run_config={"ops": {"validated_tasks": {"config": {"runs": 1, "shuffle": False, "probes": True}}}},
    )
    assert result.success
    checks = {e.asset_check_key.name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks == {"candidate_tasks_schema": True, "environment_images_complete": True, "quarantine_rate": True,
                      "no_contaminated_task_remains": True}
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
    # The tiered task set registers its version as a partition of rollout_batch, one per (version, policy).
    from assets.defs.rollouts.assets import tiered_task_set
    from assets.defs.rollouts.checks import splits_leak_free, tiers_complete

    tiered = dg.materialize([tiered_task_set, tiers_complete, splits_leak_free], resources=default_resources(settings),
                            instance=instance)
    assert tiered.success
    tier_md = tiered.asset_materializations_for_node("tiered_task_set")[0].metadata
    assert tier_md["tasks"].value == 8 and tier_md["method"].value == "static"
    assert tier_md["histogram"].value.startswith("![tiers-")
    assert [e.passed for e in tiered.get_asset_check_evaluations()] == [True, True]
    # The version's lineage is complete: the sources, what was removed (nothing here), and the params in its hash.
    lineage = tier_md["lineage"].value
    assert len(lineage["sources"]) == 8 and lineage["removed"] == []
    assert lineage["gates"]["gate"]["runs"] == 1 and lineage["gates"]["dedup"]["threshold"] == 0.5
    key = tier_md["partition_key"].value
    assert instance.get_dynamic_partitions("task_set_versions") == [key]
    assert instance.get_dynamic_partitions("rollout_policies") == ["replay"]
    # rollout_batch, SFT, GRPO and the evaluation run in tests/test_demo.py (the whole graph, --quick).


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


def test_nested_library_configs_are_nested_run_configs():
    """DedupConfig's nested configs (workspace scan, semantic stage) are nested in the asset's run config, the
    launchpad validates them, and the asset gets the library object back; the index parameters are not run config
    (a run uses the index's own)."""
    from assets.defs.config import to_library
    from assets.defs.quality.assets import DedupRunConfig
    from assets.definitions import defs
    from envforge.quality.params import DedupConfig, SemanticConfig, WorkspaceScan

    config = {"threshold": 0.4, "semantic": {"url": "http://127.0.0.1:1/v1", "model": "m"},
              "workspace": {"skip_dirs": ["vendor"]}}
    main_job = defs.resolve_job_def("main_job")
    assert dg.validate_run_config(main_job, {"ops": {"decontaminated_tasks": {"config": config}}})
    assert "index" not in DedupRunConfig.model_fields
    assert to_library(DedupRunConfig(**config), DedupConfig) == DedupConfig(
        threshold=0.4, semantic=SemanticConfig(url="http://127.0.0.1:1/v1", model="m"),
        workspace=WorkspaceScan(skip_dirs=("vendor",)))


def test_versions_travel_between_assets_not_through_the_catalogs_newest(settings):
    """tiered_task_set records the version it made; run_report, later in the same run, reports that version even
    when another version lands in the catalog between the two steps, and so does a later run of the report alone.
    The version's lineage names its sources and carries the gate and dedup params that are part of its hash."""
    from assets.defs.reporting.assets import run_report
    from assets.defs.rollouts.assets import tiered_task_set
    from envforge.catalog import Catalog
    from envforge.quality.params import DedupConfig
    from envforge.stages.configs import IngestConfig
    from envforge.stages.images import ImageSet
    from envforge.stages.ingest import ingest
    from envforge.verify.config import GateConfig
    from tests.conftest import BUNDLED_SPECS

    ingest(settings, IngestConfig(), [BUNDLED_SPECS])  # specs need no sandbox
    cat = Catalog(settings.catalog_path)
    tasks = cat.load_tasks()
    hashes = [t.content_hash for t in tasks]
    instance = dg.DagsterInstance.ephemeral()
    upstream = {"decontaminated_tasks": {"clean_versions": hashes, "removed": [], "params": DedupConfig().as_params()},
                "validated_tasks": {"accepted_versions": hashes, "removed": [], "params": GateConfig(runs=1).as_params()},
                "environment_images": {"image_set": ImageSet("").to_json()}}
    for asset, values in upstream.items():
        instance.report_runless_asset_event(dg.AssetMaterialization(
            asset, metadata={k: dg.MetadataValue.json(v) for k, v in values.items()}))
    landed: list[str] = []

    @dg.success_hook
    def another_version_lands(context):
        if context.op.name == "tiered_task_set":
            landed.append(cat.create_task_set("elsewhere", tasks[:1], {}))

    job = dg.define_asset_job("tiers_then_report", selection=["tiered_task_set", "run_report"],
                              hooks={another_version_lands})
    defs = dg.Definitions(assets=[tiered_task_set, run_report], jobs=[job], resources=default_resources(settings))
    result = defs.resolve_job_def("tiers_then_report").execute_in_process(instance=instance)
    assert result.success
    tiered = result.asset_materializations_for_node("tiered_task_set")[0].metadata
    made = tiered["version"].value
    assert landed and cat.resolve_task_set("latest") == landed[0] != made
    assert result.asset_materializations_for_node("run_report")[0].metadata["task_set_version"].value == made
    alone = dg.materialize([run_report], instance=instance, resources=default_resources(settings))
    assert alone.asset_materializations_for_node("run_report")[0].metadata["task_set_version"].value == made
    lineage = cat.lineage(made)
    assert lineage == tiered["lineage"].value
    assert sorted(s["key"] for s in lineage["sources"]) == sorted(
        f"specs/{t.id}/task.yaml" for t in tasks) and all(s["fingerprint"] for s in lineage["sources"])
    assert lineage["gates"] == {"dedup": DedupConfig().as_params()["dedup"], "gate": GateConfig(runs=1).as_params()}
    assert made == cat.task_set_version(tasks, lineage["gates"]) != cat.task_set_version(tasks, {})
