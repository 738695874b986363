"""`envforge sources`: what task sources are found on disk, and rebuilding bundled repositories."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from envforge.cli.common import DataDir, fail, out, settings_for

app = typer.Typer(help="Task sources on disk: what is found, and bundled repositories.", no_args_is_help=True)


@app.command("list")
def sources_list(
    paths: List[Path] = typer.Argument(None, help="default: the bundled task_sources/ folders"),
    as_json: bool = typer.Option(False, "--json"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Every source found under the paths: kind, key (the Dagster partition) and fingerprint."""
    from envforge.sources import fingerprint, scan_sources

    settings = settings_for(data_dir)
    found = scan_sources(paths or settings.bundled_sources())
    rows = [
        {"kind": r.kind, "key": r.key(settings.task_sources_dir), "fingerprint": fingerprint(r)} for r in found.refs
    ]
    if as_json:
        sys.stdout.write(
            json.dumps(
                {
                    "sources": rows,
                    "problems": [p.as_json() for p in found.problems],
                    "skipped": [p.as_json() for p in found.skipped],
                }
            )
            + "\n"
        )
        return
    for r in rows:
        out.print(f"{r['kind']:<9} {r['key']}  {r['fingerprint'][:12]}")
    for p in found.problems:
        out.print(f"[yellow]problem[/yellow] {p}")
    for p in found.skipped:
        out.print(f"[cyan]skipped[/cyan] {p.source}: {p.reason}")


@app.command("scan")
def sources_scan(
    paths: List[Path] = typer.Argument(
        ..., help="source files or folders (task.yaml, runbooks, tickets.yaml, reviews.yaml, history.yaml, ...)"
    ),
    as_json: bool = typer.Option(False, "--json"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """A dry run: every record the sources hold and what it would become (a task, a candidate whose tests are
    derived at ingest, skipped or rejected, with why), where its environment comes from (declared, or the
    manifests and CI jobs it was inferred from), and the statement check's verdict on each. Nothing runs
    in a sandbox and nothing is written."""
    from envforge.quality.source_scan import scan_rows
    from envforge.sources import load_by_source, scan_sources

    settings = settings_for(data_dir)
    found = scan_sources(paths)
    loaded, problems = load_by_source(paths, found)
    rows = scan_rows(loaded, settings.data_dir) + [
        {
            "source": p.source,
            "kind": "-",
            "record": p.source,
            "becomes": "rejected",
            "reason": p.reason,
            "statement": "-",
            "findings": [],
            "environment": "-",
        }
        for p in problems
    ]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["becomes"]] = counts.get(r["becomes"], 0) + 1
    if as_json:
        sys.stdout.write(json.dumps({"counts": counts, "records": rows}) + "\n")
        return
    from rich.markup import escape
    from rich.table import Table

    table = Table(
        title=f"{len(rows)} record(s) in {len(found.refs)} source(s): "
        + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    )
    for col in ("record", "kind", "becomes", "statement", "environment", "why"):
        table.add_column(col, overflow="fold")
    for r in rows:
        # Reasons quote author names and patterns (`dependabot[bot]`, `*[bot]*`) that rich would read as markup.
        why = r["reason"] or "; ".join(r["findings"][:3])
        cells = (r["record"], r["kind"], r["becomes"], r["statement"], r["environment"], why)
        table.add_row(*(escape(str(v)) for v in cells))
    out.print(table)


@app.command("build-repo")
def sources_build_repo(
    project: Path = typer.Argument(..., help="a patch-series project (patches/*.patch, repo.yaml)"),
    target: Path = typer.Argument(..., help="new directory for the repository"),
) -> None:
    """Rebuild a bundled project's git repository from its patches (same commit SHAs every time)."""
    from envforge.sources.gitrepo import build_patch_series, git

    try:
        repo = build_patch_series(project, target)
    except ValueError as exc:
        fail(exc)
    head = git(repo, "rev-parse", "HEAD").stdout.decode().strip()
    count = git(repo, "rev-list", "--count", "HEAD").stdout.decode().strip()
    out.print(f"{repo}: {count} commits, HEAD {head}")
