"""`envforge rollout`, `rollout-export` and `tiers`: policies on task sets, and difficulty tiers."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from envforge.cli.common import (
    EXIT_TOO_MANY_DROPPED,
    DataDir,
    console,
    fail,
    out,
    resolve_version,
    run_stage,
    settings_for,
)
from envforge.cli.options import config_options
from envforge.errors import InvalidValue
from envforge.rollout.config import RolloutConfig
from envforge.stages.configs import TierConfig


@config_options
def rollout(
    task_set: str = typer.Option(
        "latest", help="task-set version (prefix) or 'latest'; 'current' for the catalog's clean current tasks"
    ),
    task: List[str] = typer.Option([], "--task", "-t", help="only these task ids"),
    policy: str = typer.Option("replay", help="replay | replay-text | openai:<url>[#model] | hf:<path> | vllm:<path>"),
    config: RolloutConfig = RolloutConfig(),
    batch_id: Optional[str] = typer.Option(None, help="resume this batch (default: from set, policy, seed)"),
    out_dir: Optional[str] = typer.Option(
        None, "--out", help="store root: a path or fsspec URL (default: <ENVFORGE_STORE_URL or data dir>/rollouts)"
    ),
    as_json: bool = typer.Option(False, "--json"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Roll a policy out on a task set: n samples per task, graded, stored as parquet (resumable). Exits 3 when
    more than --max-dropped-fraction of the groups were dropped, 2 on an infrastructure fault outside the batch."""
    from envforge.catalog import Catalog
    from envforge.stages.rollout import rollout as rollout_stage

    settings = settings_for(data_dir)
    cat = Catalog(settings.catalog_path)
    if task_set == "current":
        version, tasks = "", cat.clean_tasks()
    else:
        version = resolve_version(settings, task_set)
        tasks = cat.load_task_set(version)
    if task:
        tasks = [t for t in tasks if t.id in set(task)]
    result = run_stage(
        rollout_stage, settings, config, tasks, policy, task_set_version=version, batch_id=batch_id, root=out_dir
    )
    batch = result.batch
    doc = {
        "batch_id": batch.store.batch_id,
        "location": result.location(),
        "stored_this_run": batch.report.stored,
        "resumed": batch.report.resumed,
        "dropped_groups": [g.to_json() for g in batch.report.dropped_groups],
        "dropped_fraction": round(result.dropped_fraction, 4),
        "metrics": batch.metrics,
        "mlflow_run_id": result.mlflow_run_id,
    }
    if as_json:
        sys.stdout.write(json.dumps(doc) + "\n")
    else:
        m = batch.metrics
        out.print(
            f"batch {doc['batch_id']}: {int(m['trajectories'])} trajectories ({batch.report.stored} new, "
            f"{batch.report.resumed} resumed), pass@1 {m['pass_at_1']:.3f}, {len(batch.report.dropped_groups)} "
            f"dropped group(s), {int(m['infra_retries'])} infra retries, {m['steps_per_s']:.1f} steps/s"
        )
        out.print(f"stored in {doc['location']}")
    if result.dropped_fraction > config.max_dropped_fraction:
        console.print(
            f"[red]{result.dropped_fraction:.0%} of the batch's groups were dropped, over "
            f"--max-dropped-fraction {config.max_dropped_fraction:g}:[/red] infrastructure faults outlasted "
            "the retries (the dropped groups are recorded in the batch)"
        )
        raise typer.Exit(EXIT_TOO_MANY_DROPPED)


@config_options
def tiers(
    task_set: str = typer.Option("latest", help="task-set version (prefix) or 'latest'"),
    config: TierConfig = TierConfig(),
    as_json: bool = typer.Option(False, "--json"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Difficulty tiers of a task set (pass@k of a reference policy, or static) and a stratified train/eval split
    that keeps near duplicates on one side."""
    from envforge.stages.tiers import tier_task_set

    settings = settings_for(data_dir)
    result = run_stage(tier_task_set, settings, config, resolve_version(settings, task_set))
    if as_json:
        sys.stdout.write(json.dumps({"tiers": result.rows, "chart": str(result.chart)}) + "\n")
        return
    for r in result.rows:
        out.print(
            f"{r['task_id']:<40} {r['tier']:<9} {r['split']:<6} {r['method']} "
            + (f"{r['solved']}/{r['k']}" if r["method"] == "pass@k" else f"score {r['score']}")
        )
    out.print(f"histogram: {result.chart}")


def rollout_export(
    batch_id: str = typer.Argument(...),
    path: Path = typer.Argument(...),
    fmt: str = typer.Option("verl", "--format", help="verl (parquet) | jsonl"),
    root: Optional[str] = typer.Option(
        None, "--out", help="store root (default: <ENVFORGE_STORE_URL or data dir>/rollouts)"
    ),
    service_url: Optional[str] = typer.Option(
        None,
        help="the environment service verl's reward "
        "function grades against (default: "
        "$ENVFORGE_SERVICE_URL or http://127.0.0.1:8080)",
    ),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Export a rollout batch: verl's multi-turn RL data (one row per task: system prompt, tools, task id and
    content hash, service URL), or one trajectory per JSON line."""
    from envforge.rollout.store import TrajectoryStore

    settings = settings_for(data_dir)
    store = TrajectoryStore(root or settings.artifact_root("rollouts"), batch_id)
    if store.manifest() is None:
        fail(InvalidValue(f"no rollout batch {batch_id!r} under {store.root}"))
    if fmt == "verl":
        from envforge.catalog import Catalog
        from envforge.settings import read_env

        url = service_url or read_env().service_url
        cat = Catalog(settings.catalog_path)
        version = (store.manifest() or {}).get("task_set_version") or ""
        known = bool(version) and cat.has_task_set(version)
        splits = dict(cat.tiers(version).select("task_id", "split").iter_rows()) if known else {}
        turns = dict(cat.query("SELECT content_hash, max_turns FROM tasks").iter_rows())  # every version
        n = store.export_verl(path, url, splits, turns)
    elif fmt == "jsonl":
        n = store.export_jsonl(path)
    else:
        fail(InvalidValue(f"--format {fmt!r}: expected verl or jsonl"))
    out.print(f"{n} {'tasks' if fmt == 'verl' else 'trajectories'} -> {path}")
