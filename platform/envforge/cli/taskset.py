"""`envforge taskset`: task-set versions, their lineage, diffs and SWE-bench export."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from envforge.cli.common import DataDir, fail, out, resolve_version, settings_for

app = typer.Typer(help="Versioned task sets: lineage and diffs.", no_args_is_help=True)


@app.command("list")
def taskset_list(data_dir: Optional[Path] = DataDir) -> None:
    """Every task-set version, newest last."""
    from envforge.catalog import Catalog

    for r in Catalog(settings_for(data_dir).catalog_path).task_sets().iter_rows(named=True):
        out.print(f"{r['version'][:12]}  {r['name']:24} {r['n_tasks']:5} tasks  {r['created_at']}")


@app.command("lineage")
def taskset_lineage(
    version: str = typer.Argument(..., help="task-set version (a unique prefix, or 'latest')"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Sources, gates, parent version and what was removed (and why) for a task-set version."""
    from envforge.catalog import Catalog

    settings = settings_for(data_dir)
    try:
        lineage = Catalog(settings.catalog_path).lineage(resolve_version(settings, version))
    except KeyError as exc:
        fail(exc)
    sys.stdout.write(json.dumps(lineage, indent=2) + "\n")


@app.command("export-swebench")
def taskset_export_swebench(
    version: str = typer.Argument(..., help="task-set version (a unique prefix, or 'latest')"),
    path: Path = typer.Argument(..., help="output JSONL file"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Write a task-set version's test-verified tasks as SWE-bench instances (JSONL)."""
    from envforge.catalog import Catalog
    from envforge.sources.swebench import export_swebench

    settings = settings_for(data_dir)
    tasks = Catalog(settings.catalog_path).load_task_set(resolve_version(settings, version))
    n = export_swebench(tasks, path)
    out.print(f"{n} instance(s) written to {path}")


@app.command("diff")
def taskset_diff(
    old: str = typer.Argument(..., help="the older version (a unique prefix)"),
    new: str = typer.Argument(..., help="the newer version (a unique prefix, or 'latest')"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Tasks added, removed and changed between two task-set versions."""
    from envforge.catalog import Catalog

    settings = settings_for(data_dir)
    try:
        diff = Catalog(settings.catalog_path).diff_task_sets(
            resolve_version(settings, old), resolve_version(settings, new)
        )
    except KeyError as exc:
        fail(exc)
    sys.stdout.write(json.dumps(diff, indent=2) + "\n")
