"""MLflow on SQLite under the data directory: runs, params, metrics, artifacts, nesting."""

from __future__ import annotations

import mlflow

from envforge import track
from envforge.stages.base import StageContext
from envforge.stages.configs import IngestConfig
from envforge.stages.ingest import ingest
from tests.conftest import BUNDLED_SPECS


def test_stage_logs_a_run_with_metrics_and_artifacts(settings):
    assert settings.mlflow_tracking_uri == f"sqlite:///{settings.data_dir / 'mlflow.db'}"
    with track.mlflow_run(settings, "parent", "demo", dagster_run_id="dg-123") as parent:
        tracked = ingest.tracked(settings, IngestConfig(), [BUNDLED_SPECS],
                                 context=StageContext(nested=True, dagster_run_id="dg-123"))
    client = mlflow.MlflowClient(settings.mlflow_tracking_uri)
    run = client.get_run(tracked.mlflow_run_id)
    assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert run.data.tags["dagster.run_id"] == "dg-123"
    assert run.data.tags["envforge.stage"] == "ingest"
    assert run.data.metrics["tasks_valid"] == len(tracked.result.tasks)
    assert run.data.params["strict"] == "false"
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["rejects.json", "sources.json", "statements.json"]
    artifact_root = run.info.artifact_uri
    assert artifact_root.startswith(settings.mlflow_artifacts_dir.as_uri())
    assert (settings.data_dir / "mlflow.db").is_file()


def test_tracking_uri_env_override(tmp_path):
    from envforge.config import Settings

    s = Settings.from_env({"ENVFORGE_DATA_DIR": str(tmp_path), "MLFLOW_TRACKING_URI": "http://mlflow.internal:5000"})
    assert s.mlflow_tracking_uri == "http://mlflow.internal:5000"
    assert s.catalog_path == tmp_path.resolve() / "catalog.duckdb"


def test_every_mlflow_call_runs_inside_a_run_in_the_data_directory(settings, tmp_path, monkeypatch):
    """Logging outside a run is refused (MLflow would start one of its own in ./mlruns wherever the process runs);
    the stages that used to log that way now log in their own run, in the data directory's store."""
    import pytest

    from envforge.catalog import Catalog
    from envforge.stages.configs import TaskSetConfig
    from envforge.stages.task_set import Lineage, publish_task_set

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with pytest.raises(RuntimeError, match="outside a run"):
        track.log_metrics({"x": 1.0})
    ingest(settings, IngestConfig(), [BUNDLED_SPECS])
    tasks = Catalog(settings.catalog_path).load_tasks()
    result = publish_task_set.tracked(settings, TaskSetConfig(), tasks, Lineage())
    assert mlflow.active_run() is None and list(elsewhere.iterdir()) == []  # no ./mlruns
    run = mlflow.MlflowClient(settings.mlflow_tracking_uri).get_run(result.mlflow_run_id)
    assert run.data.tags["envforge.stage"] == "task_set" and run.data.metrics["task_set_size"] == len(tasks)
    assert run.data.params["task_set_version"] == result.version
    assert run.info.artifact_uri.startswith(settings.mlflow_artifacts_dir.as_uri())
