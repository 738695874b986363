"""What every stage shares: its context, the record its result carries, and the one wrapper that
records any stage in MLflow the same way.

A stage is a plain function `fn(settings, config, *inputs, context=StageContext()) -> result`,
decorated with `@stage(name)`. Called directly it does the work and writes the catalog, and
nothing else (no MLflow). `fn.tracked(...)`, with the same arguments, runs it inside an MLflow
run in the data directory's store: the config's params first, per-step metrics while it runs
(through `context.log_metrics`), then what the result says about itself: params, metrics, JSON
artifacts, charts, files and checkpoints to register. The CLI, the Dagster assets and the demo
call the tracked form, so every entry point records the same things.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from pathlib import Path
from typing import Any, Callable, Generic, Mapping, ParamSpec, TypeVar

from envforge.config import Settings
from envforge.progress import Progress, no_progress
from envforge.sandbox.provider import SandboxProvider

MetricsSink = Callable[[Mapping[str, float], "int | None"], None]


def _drop_metrics(metrics: Mapping[str, float], step: int | None = None) -> None:
    """Untracked runs keep no per-step metrics."""


@dataclass(frozen=True)
class StageContext:
    """What a stage gets besides its settings, config and inputs."""

    progress: Progress = no_progress
    dagster_run_id: str | None = None
    nested: bool = False  # the MLflow run nests under the caller's active run
    mlflow_run_id: str | None = None  # set by `tracked`: the run the stage's records go to
    log_metrics: MetricsSink = _drop_metrics  # set by `tracked`: per-step metrics (losses, rewards)
    # Where the stage's sandboxes come from, chosen once by the entry point (`envforge.runtime.sandbox_provider`:
    # the fleet or the local engine); None: a warm pool on this process's engine.
    sandboxes: SandboxProvider | None = None


@dataclass(frozen=True)
class CheckpointRecord:
    """A checkpoint a stage wrote, to be registered in the MLflow model registry when tracked."""

    path: Path
    metrics: Mapping[str, float]
    registered_model: str
    alias: str = "best"
    is_best: bool = False
    tags: Mapping[str, str] = field(default_factory=dict)  # lineage: task set, rollout batches, start checkpoint


@dataclass(kw_only=True)
class StageResult:
    """The base of every stage's result: what the tracked wrapper records about it.

    Subclasses override the methods that apply; `mlflow_run_id` is filled in by `tracked`.
    """

    mlflow_run_id: str = ""

    def params(self) -> dict[str, Any]:
        """Inputs worth recording beside the config (task-set version, how many tasks)."""
        return {}

    def metrics(self) -> dict[str, float]:
        return {}

    def artifacts(self) -> dict[str, Any]:
        """JSON artifacts: file name -> object."""
        return {}

    def charts(self) -> list[Path]:
        """PNG charts, logged under `charts/`."""
        return []

    def files(self) -> list[tuple[Path, str]]:
        """Other files to keep with the run: (path, artifact directory)."""
        return []

    def checkpoints(self) -> list[CheckpointRecord]:
        return []


def config_params(config: Any) -> dict[str, Any]:
    """A config's MLflow params: its own `as_params()` when it has one, else its fields."""
    if hasattr(config, "as_params"):
        return dict(config.as_params())
    if is_dataclass(config):
        return asdict(config)
    return {}


P = ParamSpec("P")
R = TypeVar("R", bound=StageResult)


class Stage(Generic[P, R]):
    """A stage function with its MLflow identity; call it plainly, or `.tracked(...)`."""

    def __init__(self, fn: Callable[P, R], name: str, tag: str):
        self.fn, self.name, self.tag = fn, name, tag
        self.signature = inspect.signature(fn)
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._observed(self.signature.bind(*args, **kwargs))

    def _observed(self, bound: inspect.BoundArguments) -> R:
        """The stage with its run ids on every log line and, when ENVFORGE_METRICS_PORT is set, its
        metrics on /metrics while it runs (envforge.observe): the same for the CLI, Python and Dagster.
        In a Dagster run the default is a free port registered for Prometheus' file_sd: run workers
        overlap, so no fixed port fits them all."""
        from envforge.observe.http import metrics_server_from_env
        from envforge.observe.logs import log_context

        context = bound.arguments.get("context")
        dagster_run_id = getattr(context, "dagster_run_id", None)
        with (
            log_context(dagster_run_id=dagster_run_id, mlflow_run_id=getattr(context, "mlflow_run_id", None)),
            metrics_server_from_env(
                self.name,
                default_port=0 if dagster_run_id else None,
                labels={"dagster_run_id": dagster_run_id} if dagster_run_id else None,
                data_dir=getattr(bound.arguments.get("settings"), "data_dir", None),
            ),
        ):
            return self.fn(*bound.args, **bound.kwargs)

    def tracked(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the stage inside an MLflow run and record its result (see the module docstring)."""
        from envforge import track

        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        settings: Settings = bound.arguments["settings"]
        context: StageContext = bound.arguments["context"]
        with track.mlflow_run(
            settings,
            self.name,
            self.tag,
            config_params(bound.arguments["config"]),
            context.dagster_run_id,
            context.nested,
        ) as run:
            bound.arguments["context"] = replace(context, mlflow_run_id=run.info.run_id, log_metrics=track.log_metrics)
            result = self._observed(bound)
            record(result)
            result.mlflow_run_id = run.info.run_id
        return result


def stage(name: str, tag: str | None = None) -> Callable[[Callable[P, R]], Stage[P, R]]:
    """Declare a stage: `name` is its MLflow run name, `tag` its `envforge.stage` tag (default: name)."""

    def wrap(fn: Callable[P, R]) -> Stage[P, R]:
        return Stage(fn, name, tag or name)

    return wrap


def record(result: StageResult) -> None:
    """Log what a result says about itself into the active MLflow run."""
    from envforge import track

    if result.params():
        track.log_params(result.params())
    if result.metrics():
        track.log_metrics(result.metrics())
    for name, obj in result.artifacts().items():
        track.log_json(obj, name)
    for chart in result.charts():
        track.log_png(chart)
    for path, directory in result.files():
        track.log_file(path, directory)
    for ckpt in result.checkpoints():
        from envforge.train.checkpoint import log_checkpoint

        log_checkpoint(
            ckpt.path, dict(ckpt.metrics), ckpt.registered_model, alias=ckpt.alias, is_best=ckpt.is_best, tags=ckpt.tags
        )


def counts(values: list[str], keys: tuple[str, ...]) -> dict[str, int]:
    """How many of each key, zeros included, in the keys' order."""
    return {k: sum(1 for v in values if v == k) for k in keys}


__all__ = ["CheckpointRecord", "Stage", "StageContext", "StageResult", "config_params", "counts", "record", "stage"]
