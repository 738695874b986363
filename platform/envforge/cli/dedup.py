"""`envforge dedup`: the reference corpora and their index, and decontamination + dedup of the catalog's
current tasks."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from envforge.cli.common import DataDir, console, fail, out, run_stage, settings_for
from envforge.cli.options import config_options
from envforge.errors import EnvforgeError
from envforge.quality.params import DedupConfig, IndexConfig

app = typer.Typer(help="Decontamination against reference corpora and near-duplicate removal.", no_args_is_help=True)
corpora_app = typer.Typer(
    help="Reference corpora tasks are checked against (HumanEval is built in).", no_args_is_help=True
)
app.add_typer(corpora_app, name="corpora")

Corpus = typer.Option(
    [],
    "--corpus",
    help="NAME=PATH of a reference corpus (JSONL/parquet/text file or directory) "
    "for this run only; register one for every run with "
    "`envforge dedup corpora add`",
)


def _print_sync(report) -> None:
    for f in report.changed_files:
        console.print(f"[yellow]changed since indexed, re-read:[/yellow] {f}")
    for f in report.removed_files:
        console.print(f"retired (no longer among the corpora): {f}")
    for r in report.rejects[:20]:
        console.print(f"[yellow]skipped bad corpus record[/yellow] {r}")
    if len(report.rejects) > 20:
        console.print(f"[yellow]... and {len(report.rejects) - 20} more bad records[/yellow]")
    if report.rebuilt:
        console.print(f"[yellow]index rebuilt:[/yellow] {report.rebuilt}")


@app.command("index")
@config_options
def dedup_index(
    corpus: List[str] = Corpus,
    rebuild: bool = typer.Option(False, help="start the index afresh"),
    config: Optional[IndexConfig] = None,
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Build the reference index, or bring it in step with the corpora (new and changed files are
    read, removed ones retired). Index parameters take effect with --rebuild."""
    from envforge.quality.corpora import active_corpora
    from envforge.quality.reference_index import ReferenceIndex

    settings = settings_for(data_dir)
    root = settings.reference_index_dir
    try:
        if rebuild:
            config = config or IndexConfig()
            if root.exists():
                shutil.rmtree(root)
        index = ReferenceIndex(root, config)
        with console.status("indexing reference corpora"):
            report = index.sync(active_corpora(settings.dedup_dir, corpus))
    except (EnvforgeError, ValueError, OSError) as exc:
        fail(exc)
    _print_sync(report)
    out.print(
        f"index {root}: {index.size} documents (+{report.added_docs} from {len(report.added_files)} new "
        f"file(s), {report.unchanged_files} unchanged, {len(report.changed_files)} re-read, "
        f"{len(report.removed_files)} retired)"
    )
    out.print(f"parameters: {index.config.cli_flags() or 'defaults'}")


@app.command("run")
@config_options
def dedup_run(
    corpus: List[str] = Corpus,
    config: DedupConfig = DedupConfig(),
    as_json: bool = typer.Option(False, "--json"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Decontaminate and dedup the catalog's current tasks; verdicts (with the evidence of every
    field) go to the catalog. Uses the index's own parameters (`envforge dedup index --rebuild`
    changes them); --semantic-url turns the semantic stage on."""
    from envforge.catalog import Catalog
    from envforge.quality.corpora import active_corpora
    from envforge.stages.decontaminate import decontaminate

    settings = settings_for(data_dir)
    tasks = Catalog(settings.catalog_path).load_tasks()
    try:
        corpora = active_corpora(settings.dedup_dir, corpus)
    except (EnvforgeError, ValueError, OSError) as exc:
        fail(exc)
    with console.status(f"checking {len(tasks)} tasks"):
        result = run_stage(decontaminate, settings, config, tasks, corpora, progress=False)
    _print_sync(result.sync)
    warnings = result.warnings()
    for w in warnings:
        console.print(f"[yellow]warning:[/yellow] {w}")
    if as_json:
        rows = [dict(r, evidence=json.loads(r.pop("evidence_json") or "{}")) for r in map(dict, result.rows)]
        sys.stdout.write(
            json.dumps(
                {
                    "tasks": rows,
                    "pairs": [p.__dict__ for p in result.pairs],
                    "semantic": result.semantic.as_dict(),
                    "warnings": warnings,
                    "index": result.config.index_config.__dict__,
                    "sync": result.sync.as_dict(),
                }
            )
            + "\n"
        )
        return
    colours = {"clean": "green", "contaminated": "red", "duplicate": "yellow"}
    for r in result.rows:
        colour = colours[r["status"]]
        out.print(f"{r['task_id']}: [{colour}]{r['status']}[/{colour}] — {r['reason']}", soft_wrap=True)
    n = result.counts()
    out.print(
        f"{n['clean']} clean, {n['contaminated']} contaminated, {n['duplicate']} duplicates of {len(result.rows)}"
    )


@corpora_app.command("list")
def corpora_list(as_json: bool = typer.Option(False, "--json"), data_dir: Optional[Path] = DataDir) -> None:
    """The corpora every run uses (built-in, registered, ENVFORGE_CORPORA) and what the index holds of each."""
    from envforge.quality.corpora import CorpusRegistry, fingerprint, humaneval_digest
    from envforge.quality.reference_index import ReferenceIndex

    settings = settings_for(data_dir)
    registered = CorpusRegistry(settings.dedup_dir).load()
    root = settings.reference_index_dir
    try:
        index = ReferenceIndex(root) if (root / "manifest.json").exists() else None
    except ValueError:
        index = None
    held = index.files if index is not None else {}
    rows = [
        {
            "name": "humaneval",
            "path": "(built in)",
            "origin": "built-in",
            "files": {"builtin:humaneval": humaneval_digest()},
        }
    ]
    rows += [{"name": n, "path": p, "origin": "registered"} for n, p in sorted(registered.items())]
    from envforge.settings import read_env

    for item in read_env().corpus_specs:
        name, _, path = item.partition("=")
        rows.append({"name": name.strip(), "path": path.strip(), "origin": "ENVFORGE_CORPORA"})
    for r in rows:
        if "files" not in r:
            try:
                r["files"] = fingerprint(Path(r["path"]).resolve())
            except OSError as exc:
                r["files"], r["error"] = {}, str(exc)
        states = []
        docs = 0
        for f, digest in r["files"].items():
            entry = held.get(f)
            if entry is None or entry["corpus"] != r["name"]:
                states.append("not indexed yet")
            elif entry["digest"] != digest:
                states.append("changed since indexed")
            else:
                states.append("indexed")
                docs += entry["count"]
        r["documents"] = docs
        r["state"] = r.get("error") or (", ".join(sorted(set(states))) if states else "no files")
        r["files"] = len(r["files"])
    if as_json:
        sys.stdout.write(json.dumps(rows) + "\n")
        return
    table = Table("corpus", "origin", "path", "files", "documents indexed", "state")
    for r in rows:
        table.add_row(r["name"], r["origin"], r["path"], str(r["files"]), str(r["documents"]), r["state"])
    out.print(table)


@corpora_app.command("add")
def corpora_add(
    name: str = typer.Argument(..., help="corpus name (letters, digits, . _ -)"),
    path: Path = typer.Argument(..., help="JSONL/parquet/text file or directory"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Register a corpus: every later run checks tasks against it (it is indexed at the next run or
    `envforge dedup index`)."""
    from envforge.quality.corpora import CorpusRegistry

    try:
        resolved = CorpusRegistry(settings_for(data_dir).dedup_dir).add(name, path)
    except (EnvforgeError, OSError) as exc:
        fail(exc)
    out.print(f"registered corpus {name}: {resolved}")


@corpora_app.command("remove")
def corpora_remove(
    name: str = typer.Argument(..., help="a registered corpus"), data_dir: Optional[Path] = DataDir
) -> None:
    """Unregister a corpus; the index retires its documents at the next run or `envforge dedup index`."""
    from envforge.quality.corpora import CorpusRegistry

    try:
        CorpusRegistry(settings_for(data_dir).dedup_dir).remove(name)
    except EnvforgeError as exc:
        fail(exc)
    out.print(f"removed corpus {name}")
