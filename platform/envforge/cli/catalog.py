"""`envforge catalog`: the current tasks with their verdicts, the rejects, and parquet export."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from envforge.cli.common import DataDir, out, resolve_version, settings_for

app = typer.Typer(help="The DuckDB task catalog.", no_args_is_help=True)


@app.command("list")
def catalog_list(as_json: bool = typer.Option(False, "--json"), data_dir: Optional[Path] = DataDir) -> None:
    """List the current version of every task, with its latest flakiness-gate verdict, verifier strength
    (`strength`: killed / non-equivalent mutants, when the gate measured it; `>= a (<= b)` when grading stopped
    early and the score is a bound; `admission`: audit = audit split only) and statement verdict."""
    import polars as pl

    from envforge.catalog import Catalog
    from envforge.quality.statement_policy import statement_verdicts
    from envforge.verify.strength import strength_text

    cat = Catalog(settings_for(data_dir).catalog_path)
    frame = cat.task_listing()
    measured = {
        r["task_id"]: json.loads(r.get("stats_json") or "{}").get("strength") or {}
        for r in cat.latest_validations().to_dicts()
    }
    statements = {t: v["verdict"] for t, v in statement_verdicts(cat.load_tasks()).items()}
    frame = frame.with_columns(
        pl.col("task_id")
        .replace_strict(
            {t: s.get("strength_upper") for t, s in measured.items()}, default=None, return_dtype=pl.Float64
        )
        .alias("strength_upper"),
        pl.col("task_id").replace_strict(statements, default="-", return_dtype=pl.String).alias("statement"),
    )
    if as_json:
        sys.stdout.write(json.dumps(frame.to_dicts(), default=str) + "\n")
        return
    # a strength measured with early stop is a bound: people see `>= lower (<= upper)`, not a score
    frame = frame.with_columns(
        pl.col("task_id")
        .replace_strict({t: strength_text(s) for t, s in measured.items()}, default="-", return_dtype=pl.String)
        .alias("strength")
    ).drop("strength_upper")
    table = Table(title=f"{frame.height} task(s) in {cat.path}")
    for col in frame.columns:
        table.add_column(col)
    for row in frame.iter_rows():
        table.add_row(*["-" if v is None else ", ".join(v) if isinstance(v, list) else str(v) for v in row])
    out.print(table)


@app.command("rejects")
def catalog_rejects(
    all_loads: bool = typer.Option(False, "--all", help="every reject ever, not just each source's latest load"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Records that were rejected at ingestion, with the field and the reason."""
    from envforge.catalog import Catalog

    cat = Catalog(settings_for(data_dir).catalog_path)
    frame = cat.rejects() if all_loads else cat.current_rejects()
    for row in frame.iter_rows(named=True):
        out.print(f"{row['source']}: {row['field'] or '-'}: {row['reason']}")
    out.print(f"{frame.height} reject(s)")


@app.command("export")
def catalog_export(
    version: str = typer.Argument(..., help="task-set version (a unique prefix is enough)"),
    path: Path = typer.Argument(..., help="output parquet file"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Export a task-set version to parquet."""
    from envforge.catalog import Catalog

    settings = settings_for(data_dir)
    out.print(str(Catalog(settings.catalog_path).export_task_set(resolve_version(settings, version), path)))
