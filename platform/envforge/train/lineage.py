"""From a checkpoint back to the records it was trained on.

A checkpoint carries its lineage twice: in `trainer_state.pt` (`extra["lineage"]`, written
by the stage that saved it) and as tags on its registered model version (`log_checkpoint`).
Both hold the task-set version, the rollout batches it trained on (GRPO rounds, or SFT's
demonstration batches), the checkpoint it started from, and the MLflow and Dagster runs.
`checkpoint_lineage` follows `start_checkpoint` back to the base model, and resolves the task
set to its members' source records (catalog `sources_of`) and the batches to their catalog
entries, so every link in the chain can be opened.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envforge.config import Settings

LINEAGE_KEYS = ("stage", "task_set_version", "rollout_batches", "start_checkpoint", "mlflow_run_id", "dagster_run_id")


def _registered(settings: Settings, ref: str) -> tuple[Path | None, Any | None]:
    """(checkpoint dir, model version) for `<model>@<alias>`, `<model>/<version>` or a directory."""
    import mlflow

    from envforge.train.registry import local_copy, registry_client

    path = Path(ref)
    client = registry_client(settings)
    if path.is_dir():
        quoted = str(path.resolve()).replace("'", "\\'")
        found = client.search_model_versions(f"tags.checkpoint_path = '{quoted}'")
        return path.resolve(), (max(found, key=lambda v: int(v.last_updated_timestamp or 0)) if found else None)
    model, sep, alias = ref.partition("@")
    try:
        if sep:
            version = client.get_model_version_by_alias(model, alias)
        else:
            model, _, number = ref.rpartition("/")
            if not model or not number.isdigit():
                raise ValueError(
                    f"checkpoint {ref!r}: expected a checkpoint directory, <model>@<alias> or <model>/<version>"
                )
            version = client.get_model_version(model, number)
    except mlflow.exceptions.MlflowException as exc:
        raise ValueError(f"checkpoint {ref!r}: not in the model registry ({exc})") from None
    local = version.tags.get("checkpoint_path", "")
    return (Path(local) if local and Path(local).is_dir() else Path(local_copy(version))), version


def _from_state(path: Path) -> dict[str, str]:
    from envforge.train.checkpoint import TRAINER_STATE, read_trainer_state

    if not (path / TRAINER_STATE).is_file():
        return {}
    extra = read_trainer_state(path).get("extra", {})
    lineage = dict(extra.get("lineage") or {})
    if "base_model" in extra and "start_checkpoint" not in lineage:
        lineage["start_checkpoint"] = extra["base_model"]
    if "task_set_version" in extra:
        lineage.setdefault("task_set_version", extra["task_set_version"])
    return {k: str(v) for k, v in lineage.items()}


def _batches(settings: Settings, batch_ids: list[str]) -> list[dict[str, Any]]:
    from envforge.catalog import Catalog

    if not batch_ids:
        return []
    frame = Catalog(settings.catalog_path).rollout_batches()
    rows = {r["batch_id"]: r for r in frame.iter_rows(named=True)} if frame.height else {}
    keep = ("location", "policy_id", "n_tasks", "n_samples", "n_trajectories", "pass_at_1")
    return [
        {"batch_id": b, **({k: rows[b][k] for k in keep} if b in rows else {"missing": "not in the catalog"})}
        for b in batch_ids
    ]


def _task_set(settings: Settings, version: str) -> dict[str, Any]:
    from envforge.catalog import Catalog

    catalog = Catalog(settings.catalog_path)
    try:
        full = catalog.resolve_task_set(version)
    except (KeyError, ValueError):
        return {"version": version, "missing": "not a task set in this catalog"}
    members = catalog.task_set_frame(full)
    try:
        lineage = catalog.lineage(full)
    except KeyError:
        lineage = {"parent_version": None, "gates": {}}
    return {
        "version": full,
        "tasks": members.height,
        "parent_version": lineage["parent_version"],
        "gates": lineage["gates"],
        "source_records": catalog.sources_of(members["content_hash"].to_list()),
    }


def checkpoint_lineage(settings: Settings, ref: str, _depth: int = 0) -> dict[str, Any]:
    """The chain from a checkpoint (directory, `<model>@<alias>` or `<model>/<version>`) back to its base
    model, each link with its registry version, runs, rollout batches and task set with source records."""
    path, version = _registered(settings, ref)
    if path is None or not path.is_dir():
        raise ValueError(f"checkpoint {ref!r}: no such directory")
    lineage = _from_state(path)
    node: dict[str, Any] = {"checkpoint": str(path)}
    if version is not None:
        tags = dict(version.tags)
        lineage.update({k: tags[k] for k in LINEAGE_KEYS if tags.get(k)})
        node["registered"] = {
            "model": version.name,
            "version": version.version,
            "aliases": list(getattr(version, "aliases", []) or []),
            "source": version.source,
            "eval": {k: v for k, v in tags.items() if k.startswith("eval.") or k == "promoted"},
        }
    node.update({k: lineage.get(k, "") for k in ("stage", "mlflow_run_id", "dagster_run_id")})
    batch_ids = [b for b in lineage.get("rollout_batches", "").split(",") if b]
    node["rollout_batches"] = _batches(settings, batch_ids)
    if lineage.get("task_set_version"):
        node["task_set"] = _task_set(settings, lineage["task_set_version"])
    start = lineage.get("start_checkpoint", "")
    if start and Path(start).is_dir() and _depth < 16:
        node["from"] = checkpoint_lineage(settings, start, _depth + 1)
    elif start:
        node["from"] = {"base_model": start}
    return node


def format_lineage(node: dict[str, Any], indent: int = 0) -> list[str]:
    """The chain as indented text lines (what `envforge lineage` prints)."""
    pad = "  " * indent
    if "base_model" in node:
        return [f"{pad}base model {node['base_model']}"]
    reg = node.get("registered")
    lines = [f"{pad}checkpoint {node['checkpoint']}" + (f"  [{node['stage']}]" if node.get("stage") else "")]
    if reg:
        aliases = f" (aliases: {', '.join(reg['aliases'])})" if reg["aliases"] else ""
        lines.append(
            f"{pad}  registered {reg['model']} v{reg['version']}{aliases}" + (f"  {reg['eval']}" if reg["eval"] else "")
        )
    else:
        lines.append(f"{pad}  not registered")
    lines.append(
        f"{pad}  MLflow run {node.get('mlflow_run_id') or '-'}, Dagster run {node.get('dagster_run_id') or '-'}"
    )
    for b in node.get("rollout_batches", []):
        lines.append(
            f"{pad}  rollout batch {b['batch_id']}: "
            + (
                b["missing"]
                if "missing" in b
                else f"{b['n_trajectories']} trajectories, pass@1 {b['pass_at_1']:.2f}, {b['location']}"
            )
        )
    ts = node.get("task_set")
    if ts:
        if "missing" in ts:
            lines.append(f"{pad}  task set {ts['version']}: {ts['missing']}")
        else:
            lines.append(
                f"{pad}  task set {ts['version'][:12]}: {ts['tasks']} tasks, parent "
                f"{(ts['parent_version'] or '-')[:12]}"
            )
            lines.extend(
                f"{pad}    source {s['kind']} {s['key']} {s['fingerprint'][:12]}" for s in ts["source_records"]
            )
    if "from" in node:
        lines.append(f"{pad}  from:")
        lines.extend(format_lineage(node["from"], indent + 2))
    return lines
