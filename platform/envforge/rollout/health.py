"""A rollout batch's health from what it stored: the figures `observe.health` judges, read from the
batch's trajectories and dropped groups, and the verdicts of the catalog's batches and of a
training round's rollouts (docs/observability.md).

`observe.health` judges plain figures and imports no domain package; reading them from the
trajectory store is the rollout package's.
"""

from __future__ import annotations

import logging
import statistics
from typing import Any, Sequence

from envforge.observe.health import (
    BOTH,
    INFRA,
    POLICY,
    BatchFigures,
    HealthThresholds,
    HealthVerdict,
    judge,
    thresholds_from_env,
)
from envforge.rollout.store import TrajectoryStore
from envforge.rollout.trajectory import DroppedGroup, Trajectory


def batch_figures(
    batch_id: str,
    trajectories: Sequence[Trajectory],
    dropped: Sequence[DroppedGroup],
    n_tasks: int | None = None,
    policy_id: str = "",
) -> BatchFigures:
    """What one batch's infrastructure and policy did, from its trajectories and dropped groups."""
    attempts = sum(1 + t.infra_retries for t in trajectories)
    faults = sum(t.infra_retries for t in trajectories)
    for g in dropped:
        # A dropped group's samples are not stored: count its attempts from the record (every
        # attempt of a failed sample was a fault; a finished sample's last attempt was not).
        done = set(g.completed_samples)
        for sample, n in g.attempts.items():
            attempts += int(n)
            faults += int(n) - 1 if int(sample) in done else int(n)
    resets = [t.timings["reset_s"] for t in trajectories if "reset_s" in t.timings]
    steps = [t.timings["env_s"] / len(t.turns) for t in trajectories if t.turns and "env_s" in t.timings]
    by_task: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        by_task.setdefault(t.task_id, []).append(t)
    clean = {
        task: (statistics.fmean(t.reward for t in ts), statistics.fmean(float(t.resolved) for t in ts))
        for task, ts in by_task.items()
        if all(t.infra_retries == 0 for t in ts)
    }
    tasks = n_tasks if n_tasks is not None else len(by_task) + len({g.task_id for g in dropped})
    policy = policy_id or (trajectories[0].policy_id if trajectories else "")
    return BatchFigures(
        batch_id,
        policy,
        tasks,
        len(trajectories),
        attempts,
        faults,
        sum(1 for t in trajectories if t.infra_retries),
        len(dropped),
        statistics.median(resets) if resets else None,
        statistics.median(steps) if steps else None,
        clean,
    )


def store_figures(store: TrajectoryStore) -> BatchFigures:
    manifest = store.manifest() or {}
    tasks = manifest.get("tasks")
    return batch_figures(
        store.batch_id,
        store.trajectories(),
        store.dropped(),
        len(tasks) if tasks is not None else None,
        manifest.get("policy_id", ""),
    )


def judge_stores(
    current: TrajectoryStore, baseline: TrajectoryStore | None, thresholds: HealthThresholds = HealthThresholds()
) -> HealthVerdict:
    return judge(store_figures(current), store_figures(baseline) if baseline else None, thresholds)


def store_at(location: str, batch_id: str) -> TrajectoryStore:
    """The store of a catalog row (`location` is `<root>/<batch_id>`)."""
    suffix = "/" + batch_id
    root = location[: -len(suffix)] if location.endswith(suffix) else location
    return TrajectoryStore(root, batch_id)


def catalog_verdicts(
    batches: Sequence[dict[str, Any]], thresholds: HealthThresholds = HealthThresholds()
) -> dict[str, HealthVerdict]:
    """Every batch's verdict against the batch registered before it on the same task-set version.

    `batches`: catalog rows (Catalog.rollout_batches(), oldest first)."""
    out: dict[str, HealthVerdict] = {}
    figures: dict[str, BatchFigures] = {}
    previous: dict[str, str] = {}
    for row in batches:
        bid = row["batch_id"]
        figures[bid] = store_figures(store_at(row["location"], bid))
        prev = previous.get(row["task_set_version"])
        out[bid] = judge(figures[bid], figures[prev] if prev else None, thresholds)
        previous[row["task_set_version"]] = bid
    return out


def round_health(
    batch: Any, previous: Any | None, thresholds: HealthThresholds = HealthThresholds()
) -> dict[str, float]:
    """A training round's verdict as metrics (0/1 flags and the figures behind them), for the round's
    MLflow history: `batch` and `previous` are BatchResults of consecutive rounds' rollouts."""
    verdict = judge_stores(batch.store, previous.store if previous is not None else None, thresholds)
    logging.getLogger("envforge.observe").info(
        "round health", extra={"verdict": verdict.verdict, "health": verdict.as_json()}
    )
    cur = verdict.figures["current"]
    return {
        "health_infra_anomaly": float(verdict.verdict in (INFRA, BOTH)),
        "health_policy_regression": float(verdict.verdict in (POLICY, BOTH)),
        "health_fault_rate": float(cur["fault_rate"]),
        "health_drop_rate": float(cur["drop_rate"]),
        "health_clean_tasks": float(cur["clean_tasks"]),
    }


def batch_verdict(
    batches: Sequence[dict[str, Any]], batch_id: str, thresholds: HealthThresholds | None = None
) -> HealthVerdict:
    """The verdict of `batch_id` against the batch registered just before it on the same task-set version.

    `batches`: catalog rows (Catalog.rollout_batches(), oldest first)."""
    rows = {r["batch_id"]: r for r in batches}
    if batch_id not in rows:
        raise ValueError(f"rollout batch {batch_id!r} is not registered in the catalog")
    row = rows[batch_id]
    before = [r for r in batches if r["task_set_version"] == row["task_set_version"]]
    index = [r["batch_id"] for r in before].index(batch_id)
    prev = before[index - 1] if index else None
    return judge(
        store_figures(store_at(row["location"], batch_id)),
        store_figures(store_at(prev["location"], prev["batch_id"])) if prev else None,
        thresholds or thresholds_from_env(),
    )
