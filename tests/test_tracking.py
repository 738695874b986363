"""MLflow on SQLite under the data directory: runs, params, metrics, artifacts, nesting."""

from __future__ import annotations

import mlflow

from envforge import stages, track
from tests.conftest import BUNDLED_SPECS


def test_stage_logs_a_run_with_metrics_and_artifacts(settings):
    assert settings.mlflow_tracking_uri == f"sqlite:///{settings.data_dir / 'mlflow.db'}"
    with track.mlflow_run(settings, "parent", "demo", dagster_run_id="dg-123") as parent:
        tracked = stages.ingest(settings, [BUNDLED_SPECS], nested=True, dagster_run_id="dg-123")
    client = mlflow.MlflowClient(settings.mlflow_tracking_uri)
    run = client.get_run(tracked.mlflow_run_id)
    assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert run.data.tags["dagster.run_id"] == "dg-123"
    assert run.data.tags["envforge.stage"] == "ingest"
    assert run.data.metrics["tasks_valid"] == len(tracked.result.tasks)
    assert run.data.params["strict"] == "false"
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["rejects.json", "sources.json"]
    artifact_root = run.info.artifact_uri
    assert artifact_root.startswith(settings.mlflow_artifacts_dir.as_uri())
    assert (settings.data_dir / "mlflow.db").is_file()


def test_tracking_uri_env_override(tmp_path):
    from envforge.config import Settings

    s = Settings.from_env({"ENVFORGE_DATA_DIR": str(tmp_path), "MLFLOW_TRACKING_URI": "http://mlflow.internal:5000"})
    assert s.mlflow_tracking_uri == "http://mlflow.internal:5000"
    assert s.catalog_path == tmp_path.resolve() / "catalog.duckdb"
