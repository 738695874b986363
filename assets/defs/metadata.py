"""Helpers that turn library results into Dagster metadata people can read in the UI."""

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import dagster as dg

from envforge import track
from envforge.charts import png_data_uri
from envforge.config import Settings
from envforge.errors import Problem

if TYPE_CHECKING:
    from envforge.stages.base import StageContext


def png(path: Path) -> dg.MetadataValue:
    """An inline PNG (rendered by the UI's markdown viewer)."""
    return dg.MetadataValue.md(f"![{Path(path).name}]({png_data_uri(path)})")


def problems_table(problems: Iterable[Problem]) -> dg.MetadataValue:
    rows = ["| source | record | field | reason |", "|---|---|---|---|"]
    rows += [f"| {p.file} | {p.record or '-'} | {p.field or '-'} | {p.reason.replace('|', '/')[:300]} |"
             for p in problems]
    return dg.MetadataValue.md("\n".join(rows) if len(rows) > 2 else "no problems")


def mlflow_run(settings: Settings, run_id: str) -> dg.MetadataValue:
    """A link to the run's page in the MLflow UI (the UI shows it as a clickable URL)."""
    return dg.MetadataValue.url(track.run_url(settings, run_id)) if run_id else dg.MetadataValue.text("no MLflow run")


def log_progress(context: dg.AssetExecutionContext):
    """A library progress callback that writes Dagster log lines (about every tenth of a stage, and its end)."""

    def progress(stage: str, detail: str, done: int, total: int) -> None:
        if total <= 10 or done == total or done % max(1, total // 10) == 0:
            context.log.info(f"[{stage}] {done}/{total} {detail}")

    return progress


def upstream(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext, asset: str,
             required: bool = True) -> dict[str, Any]:
    """What `asset`'s materialization recorded: the one in this run when the asset ran in it, else its latest
    (never materialized: a Failure, or {} when not `required`).

    This is how versions travel between assets: each asset records the task-set version, task versions
    and images it produced, and the assets after it read them here, never the catalog's newest. A
    version landing from another run between two stages of this run does not change what they use.
    """
    key = dg.AssetKey(asset)
    records = context.instance.get_records_for_run(context.run.run_id,
                                                   of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records
    for rec in reversed(records):
        mat = rec.event_log_entry.asset_materialization
        if mat is not None and mat.asset_key == key:
            return _values(mat.metadata)
    event = context.instance.get_latest_materialization_event(key)
    if event is None or event.asset_materialization is None:
        if not required:
            return {}
        raise dg.Failure(f"{asset} has not been materialized yet: materialize it first")
    return _values(event.asset_materialization.metadata)


def _values(metadata: dict) -> dict[str, Any]:
    return {k: getattr(v, "value", v) for k, v in metadata.items()}


def stage_context(context: dg.AssetExecutionContext) -> "StageContext":
    """What a stage called from an asset gets: progress as Dagster log lines, the Dagster run id, and
    its sandboxes from the provider the environment chooses (the fleet when ENVFORGE_RAY_ADDRESS is set)."""
    from envforge.runtime import sandbox_provider
    from envforge.stages.base import StageContext

    return StageContext(progress=log_progress(context), dagster_run_id=context.run.run_id,
                        sandboxes=sandbox_provider())
