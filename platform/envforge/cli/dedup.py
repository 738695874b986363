"""`envforge dedup`: the reference index, and decontamination + dedup of the catalog's current tasks."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import List, Optional

import typer

from envforge.cli.common import DataDir, console, fail, out, run_stage, settings_for
from envforge.cli.options import config_options
from envforge.errors import EnvforgeError
from envforge.quality.params import DedupConfig

app = typer.Typer(help="Decontamination and near-duplicate removal (MinHash LSH).", no_args_is_help=True)

Corpus = typer.Option([], "--corpus", help="NAME=PATH of a reference corpus (JSONL/parquet/text file or "
                                           "directory); HumanEval and ENVFORGE_CORPORA are always included")


@app.command("index")
def dedup_index(corpus: List[str] = Corpus, rebuild: bool = typer.Option(False, help="start the index afresh"),
                data_dir: Optional[Path] = DataDir) -> None:
    """Build or incrementally update the persisted reference index (new corpus files only)."""
    from envforge.quality.corpora import corpora_from_env
    from envforge.quality.reference_index import ReferenceIndex

    settings = settings_for(data_dir)
    root = settings.reference_index_dir
    try:
        if rebuild and root.exists():
            shutil.rmtree(root)
        index = ReferenceIndex(root, DedupConfig())
        with console.status("indexing reference corpora"):
            report = index.sync(corpora_from_env(extra=corpus))
    except (EnvforgeError, ValueError, OSError) as exc:
        fail(exc)
    out.print(f"index {root}: {index.size} documents (+{report.added_docs} from {len(report.added_files)} new "
              f"file(s), {report.unchanged_files} unchanged)")
    for f in report.changed_files:
        out.print(f"[yellow]changed since indexed, not re-read:[/yellow] {f} (use --rebuild)")


@app.command("run")
@config_options
def dedup_run(corpus: List[str] = Corpus, config: DedupConfig = DedupConfig(),
              as_json: bool = typer.Option(False, "--json"), data_dir: Optional[Path] = DataDir) -> None:
    """Decontaminate and dedup the catalog's current tasks; verdicts go to the catalog."""
    from envforge.catalog import Catalog
    from envforge.quality.corpora import corpora_from_env
    from envforge.stages.decontaminate import decontaminate

    settings = settings_for(data_dir)
    tasks = Catalog(settings.catalog_path).load_tasks()
    try:
        corpora = corpora_from_env(extra=corpus)
    except ValueError as exc:
        fail(exc)
    result = run_stage(decontaminate, settings, config, tasks, corpora, progress=False)
    if as_json:
        sys.stdout.write(json.dumps({"tasks": result.rows, "pairs": [p.__dict__ for p in result.pairs]}) + "\n")
        return
    for r in result.rows:
        flag = "" if r["status"] == "clean" else f" — {r['reason']}"
        out.print(f"{r['task_id']}: {r['status']} (best corpus match J={r['exact_jaccard']:.2f}){flag}")
