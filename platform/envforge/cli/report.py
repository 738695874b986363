"""`envforge report`: the run report of a task set, one self-contained HTML page."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from envforge.cli.common import DataDir, console, fail, run_stage, settings_for
from envforge.errors import EnvforgeError


def report(
    task_set: str = typer.Option("latest", help="task-set version (prefix) or 'latest'"),
    open_path: bool = typer.Option(
        False, "--open-path", help="print a file:// URL to open in a browser instead of the plain path"
    ),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Write the run report of a task set: one self-contained HTML page (card, gates, rollouts, training, charts)
    under <data dir>/reports, logged to MLflow; stages that have not run are shown as 'not run yet'."""
    from envforge.catalog import Catalog
    from envforge.report import report_version
    from envforge.stages.configs import ReportConfig
    from envforge.stages.report import report as report_stage

    settings = settings_for(data_dir)
    try:
        version = report_version(Catalog(settings.catalog_path), task_set)
    except EnvforgeError as exc:
        fail(exc)
    result = run_stage(report_stage, settings, ReportConfig(), version, progress=False).report
    not_run = [k for k, ran in result.sections.items() if not ran]
    if not_run:
        console.print(f"not run yet: {', '.join(not_run)}")
    console.print(f"MLflow run {result.mlflow_run_id}; also {result.latest}")
    sys.stdout.write((result.path.resolve().as_uri() if open_path else str(result.path)) + "\n")
