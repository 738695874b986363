"""Helpers that turn library results into Dagster metadata people can read in the UI."""

from pathlib import Path
from typing import Iterable

import dagster as dg

from envforge import track
from envforge.charts import png_data_uri
from envforge.config import Settings
from envforge.errors import Problem


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
