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
from assets.defs.sources.assets import task_specs
from assets.defs.quality.assets import contamination_report, decontaminated_tasks
from assets.defs.quality.checks import no_contaminated_task_remains, splits_leak_free
from assets.defs.sources.checks import task_specs_schema
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
    assert {"task_specs", "decontaminated_tasks", "contamination_report", "environment_images",
            "validated_tasks"} <= keys
    assert defs.resolve_job_def("main_job") is not None


@pytest.mark.docker
def test_materialize_first_assets_in_process(settings, docker_client):
    result = dg.materialize(
        [task_specs, decontaminated_tasks, contamination_report, environment_images, validated_tasks,
         task_specs_schema, no_contaminated_task_remains, splits_leak_free, environment_images_complete,
         quarantine_rate],
        resources=default_resources(settings), instance=dg.DagsterInstance.ephemeral(),
        run_config={"ops": {"validated_tasks": {"config": {"runs": 1, "shuffle": False, "probes": True}}}},
    )
    assert result.success
    checks = {e.asset_check_key.name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks == {"task_specs_schema": True, "environment_images_complete": True, "quarantine_rate": True,
                      "no_contaminated_task_remains": True, "splits_leak_free": True}
    quality_md = result.asset_materializations_for_node("decontaminated_tasks")[0].metadata
    assert quality_md["clean"].value == 8 and quality_md["contaminated"].value == 0
    assert quality_md["index_docs_added"].value == 164  # HumanEval, indexed once
    gate_md = result.asset_materializations_for_node("validated_tasks")[0].metadata
    assert gate_md["accepted"].value == 8 and gate_md["quarantined"].value == 0
    assert gate_md["chart"].value.startswith("![flake_report.png](data:image/png;base64,")
    specs_md = result.asset_materializations_for_node("task_specs")[0].metadata
    assert specs_md["valid"].value >= 3 and specs_md["rejected"].value == 0
    images_md = result.asset_materializations_for_node("environment_images")[0].metadata
    assert set(images_md["images"].value) >= {"inventory-median-even", "ops-service-config", "orders-daily-summary"}
    # Each materialization logged an MLflow run tagged with the Dagster run id.
    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
    runs = mlflow.search_runs(experiment_names=[settings.mlflow_experiment],
                              filter_string=f"tags.`dagster.run_id` = '{result.run_id}'", output_format="list")
    assert {r.data.tags["envforge.stage"] for r in runs} == {"ingest", "quality", "images", "validate"}
