"""`envforge ingest` (task sources into the catalog) and `envforge schema` (the task spec's JSON Schema)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from envforge.cli.common import DataDir, console, out, settings_for
from envforge.cli.exit_codes import ExitCode
from envforge.cli.options import config_options
from envforge.errors import BatchRejectedError
from envforge.stages.configs import IngestConfig


@config_options
def ingest(
    paths: List[Path] = typer.Argument(
        ..., help="source files or directories: task.yaml, runbook .md, tickets.yaml, reviews.yaml, SWE-bench .jsonl"
    ),
    config: IngestConfig = IngestConfig(),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Load task sources, derive tests for tickets and reviews in sandboxes, and store the tasks (and the
    rejects, with file, record, field and reason) in the catalog."""
    from envforge.progress import rich_progress
    from envforge.runtime import sandbox_provider
    from envforge.stages.base import StageContext
    from envforge.stages.ingest import ingest as ingest_stage

    settings = settings_for(data_dir)
    try:
        with rich_progress(console) as progress:
            tracked = ingest_stage.tracked(
                settings, config, paths, context=StageContext(progress=progress, sandboxes=sandbox_provider())
            )
    except BatchRejectedError as exc:
        if as_json:
            out.print_json(
                json.dumps(
                    {
                        "valid": 0,
                        "rejected": len(exc.problems),
                        "written": False,
                        "rejects": [p.as_json() for p in exc.problems],
                    }
                )
            )
        else:
            console.print(f"[red]{exc}[/red]")
        raise typer.Exit(ExitCode.USAGE)  # --strict: the input is invalid, nothing was written
    res, summ = tracked.result, tracked.summary
    if as_json:
        sys.stdout.write(
            json.dumps(
                {
                    "valid": len(res.tasks),
                    "rejected": len(res.rejects),
                    "added": summ.added,
                    "unchanged": summ.unchanged,
                    "rejects": [p.as_json() for p in res.rejects],
                    "tasks": [t.id for t in res.tasks],
                    "by_kind": {
                        k: sum(1 for t in res.tasks if t.spec.source == k)
                        for k in sorted({t.spec.source for t in res.tasks})
                    },
                    "skipped": [{"source": p.source, "reason": p.reason} for p in tracked.skipped],
                    "mlflow_run_id": tracked.mlflow_run_id,
                }
            )
            + "\n"
        )
        return
    out.print(
        f"{len(res.tasks)} valid task(s) ({summ.added} new, {summ.unchanged} unchanged), "
        f"{len(res.rejects)} rejected" + (f", {len(tracked.skipped)} file(s) skipped" if tracked.skipped else "")
    )
    for p in res.rejects:
        out.print(f"  [yellow]rejected[/yellow] {p}")
    for p in tracked.skipped:
        out.print(f"  [cyan]skipped[/cyan] {p.source}: {p.reason}")


def schema(output: Optional[Path] = typer.Option(None, "-o", help="write here instead of stdout")) -> None:
    """Print the JSON Schema of the YAML task spec."""
    from envforge.task import task_spec_json_schema

    text = json.dumps(task_spec_json_schema(), indent=2) + "\n"
    if output:
        output.write_text(text)
    else:
        sys.stdout.write(text)
