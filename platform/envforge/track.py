"""MLflow helpers: every CLI command and every asset materialization is an MLflow run.

Tracking defaults to SQLite under the data directory (MLflow 3 refuses the ./mlruns file
store) with artifacts beside it; MLFLOW_TRACKING_URI points elsewhere. Runs carry the
Dagster run id when there is one, and per-stage work is logged as nested runs.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

from envforge.config import Settings

# MLflow's alembic migrations log at INFO on first use; they are noise for our users.
for _noisy in ("alembic", "mlflow.store.db.utils"):
    logging.getLogger(_noisy).setLevel(logging.WARNING)
os.environ.setdefault("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "false")

DAGSTER_RUN_TAG = "dagster.run_id"
STAGE_TAG = "envforge.stage"


def _mlflow():
    import mlflow  # imported lazily: it is slow to import and not every command needs it

    return mlflow


def _set_tracking_uri(mlflow, uri: str) -> None:
    """Point the fluent API at `uri` without leaking it into os.environ.

    mlflow.set_tracking_uri also exports MLFLOW_TRACKING_URI, which would make every later
    Settings.from_env() in this process (another Dagster resource config, a test) inherit it.
    """
    before = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before


def experiment_id(settings: Settings) -> str:
    """Point MLflow at the configured store and return the experiment id, creating it once."""
    mlflow = _mlflow()
    settings.ensure_dirs()
    _set_tracking_uri(mlflow, settings.mlflow_tracking_uri)
    exp = mlflow.get_experiment_by_name(settings.mlflow_experiment)
    if exp is not None:
        return exp.experiment_id
    location = settings.mlflow_artifacts_dir.as_uri() if settings.mlflow_tracking_uri.startswith("sqlite") else None
    try:
        return mlflow.create_experiment(settings.mlflow_experiment, artifact_location=location)
    except Exception:  # created concurrently by another process: use theirs
        exp = mlflow.get_experiment_by_name(settings.mlflow_experiment)
        if exp is None:
            raise
        return exp.experiment_id


@contextmanager
def mlflow_run(
    settings: Settings,
    name: str,
    stage: str,
    params: Mapping[str, Any] | None = None,
    dagster_run_id: str | None = None,
    nested: bool = False,
    tags: Mapping[str, str] | None = None,
) -> Iterator[Any]:
    """Start an MLflow run (nested under the active one if `nested`); yields the ActiveRun."""
    mlflow = _mlflow()
    exp = experiment_id(settings)
    all_tags = {STAGE_TAG: stage, **(tags or {})}
    if dagster_run_id:
        all_tags[DAGSTER_RUN_TAG] = dagster_run_id
    with mlflow.start_run(experiment_id=exp, run_name=name, nested=nested, tags=all_tags) as run:
        if params:
            log_params(params)
        yield run


def _param(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:6000]


def _active():
    """The fluent API, but only inside a run: outside one MLflow would start a run of its own in
    ./mlruns wherever the process happens to be, which is never what we want."""
    mlflow = _mlflow()
    if mlflow.active_run() is None:
        raise RuntimeError(
            "MLflow logging outside a run: wrap the work in envforge.track.mlflow_run "
            "(or call the stage's .tracked form)"
        )
    return mlflow


def log_params(params: Mapping[str, Any]) -> None:
    _active().log_params({k: _param(v) for k, v in params.items()})


def log_metrics(metrics: Mapping[str, float], step: int | None = None) -> None:
    _active().log_metrics({k: float(v) for k, v in metrics.items()}, step=step)


def log_json(obj: Any, artifact_file: str) -> None:
    _active().log_dict(obj, artifact_file)


def log_file(path: Path, artifact_dir: str) -> None:
    _active().log_artifact(str(path), artifact_path=artifact_dir)


def log_png(path: Path, artifact_dir: str = "charts") -> None:
    log_file(path, artifact_dir)


def log_frame(frame: Any, artifact_file: str) -> None:
    """A polars frame as a parquet artifact (the service's session batches)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / Path(artifact_file).name
        frame.write_parquet(path)
        log_file(path, str(Path(artifact_file).parent))


def run_url(settings: Settings, run_id: str) -> str:
    """The run's page in the MLflow UI: on the tracking server itself when it is http(s), otherwise at
    ENVFORGE_MLFLOW_UI_URL (default: where `make mlflow-ui` serves the local store)."""
    uri = settings.mlflow_tracking_uri
    from envforge.settings import read_env

    base = uri if uri.startswith(("http://", "https://")) else read_env().mlflow_ui_url
    return f"{base.rstrip('/')}/#/experiments/{experiment_id(settings)}/runs/{run_id}"


def ui_command(settings: Settings) -> str:
    return (
        f"mlflow ui --backend-store-uri {settings.mlflow_tracking_uri} "
        f"--default-artifact-root {settings.mlflow_artifacts_dir.as_uri()} --host 127.0.0.1 --port 5000"
    )
