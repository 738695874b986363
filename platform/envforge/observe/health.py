"""Infrastructure anomaly or policy regression? A verdict for a rollout batch against the batch
before it on the same task set.

A drop in reward has two kinds of causes, and the training team acts differently on each: the
infrastructure (containers killed, a slow or restarting engine: faults, retries, dropped groups,
slower sandboxes) or the policy (a worse checkpoint: lower reward on tasks the infrastructure did
not touch). So the two sides are judged on separate figures:

- infrastructure: the fault rate (infrastructure faults per attempt), the share of trajectories
  that needed a retry, the share of groups dropped, and the sandbox latency (median reset and
  median per-step sandbox time), each against the previous batch (and the fault rate also
  against an absolute ceiling, so a first batch can be judged too);
- policy: mean reward and pass@1 on the *cleanly-run* tasks (every sample finished on its first
  attempt) that both batches share. A task touched by a fault is left out of this side, so
  faults cannot pass for a regression; the scheduler already retries them on fresh sandboxes.

The verdict is one of `healthy`, `infrastructure anomaly`, `policy regression`, `both`, with the
figures and the rules that fired. Thresholds are a dataclass (defaults documented in
docs/observability.md); without a previous batch only the absolute infrastructure rules apply.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from envforge.rollout.store import TrajectoryStore
from envforge.rollout.trajectory import DroppedGroup, Trajectory

HEALTHY, INFRA, POLICY, BOTH = "healthy", "infrastructure anomaly", "policy regression", "both"
VERDICTS = (HEALTHY, INFRA, POLICY, BOTH)


@dataclass(frozen=True)
class HealthThresholds:
    """When a change between two batches counts. Rates are shares (0..1), latencies seconds."""

    max_fault_rate_increase: float = field(default=0.05, metadata={
        "help": "infrastructure faults per attempt may grow by at most this much over the previous batch"})
    max_fault_rate: float = field(default=0.2, metadata={
        "help": "infrastructure faults per attempt above this are an anomaly even without a previous batch"})
    max_retry_rate_increase: float = field(default=0.1, metadata={
        "help": "the share of trajectories that needed a retry may grow by at most this much"})
    max_drop_rate_increase: float = field(default=0.0, metadata={
        "help": "the share of groups dropped may grow by at most this much (0: any new drop counts)"})
    max_latency_ratio: float = field(default=2.0, metadata={
        "help": "median sandbox reset or per-step time may grow by at most this factor ..."})
    min_latency_increase_s: float = field(default=0.1, metadata={
        "help": "... and a latency rule fires only when the median also grew by this many seconds (noise floor)"})
    max_reward_drop: float = field(default=0.1, metadata={
        "help": "mean reward on the shared cleanly-run tasks may fall by at most this much"})
    max_pass_at_1_drop: float = field(default=0.1, metadata={
        "help": "pass@1 on the shared cleanly-run tasks may fall by at most this much"})
    min_clean_tasks: int = field(default=2, metadata={
        "help": "the policy side is judged only on at least this many shared cleanly-run tasks"})

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value < 0:
                raise ValueError(f"HealthThresholds.{name}: must be >= 0, got {value}")
        if self.max_latency_ratio < 1:
            raise ValueError(f"HealthThresholds.max_latency_ratio: must be >= 1, got {self.max_latency_ratio}")


@dataclass
class BatchFigures:
    """What one batch's infrastructure and policy did, from its stored trajectories and dropped groups."""

    batch_id: str
    policy_id: str
    tasks: int
    trajectories: int
    attempts: int
    infra_faults: int
    retried_trajectories: int
    dropped_groups: int
    reset_p50_s: float | None
    step_p50_s: float | None
    clean_tasks: dict[str, tuple[float, float]]  # task id -> (mean reward, pass@1) over its samples

    @property
    def fault_rate(self) -> float:
        return self.infra_faults / self.attempts if self.attempts else 0.0

    @property
    def retry_rate(self) -> float:
        return self.retried_trajectories / self.trajectories if self.trajectories else 0.0

    @property
    def drop_rate(self) -> float:
        return self.dropped_groups / self.tasks if self.tasks else 0.0

    def summary(self) -> dict[str, Any]:
        r = lambda x: None if x is None else round(x, 4)  # noqa: E731
        return {"batch_id": self.batch_id, "policy_id": self.policy_id, "tasks": self.tasks,
                "trajectories": self.trajectories, "attempts": self.attempts, "infra_faults": self.infra_faults,
                "fault_rate": r(self.fault_rate), "retry_rate": r(self.retry_rate),
                "dropped_groups": self.dropped_groups, "drop_rate": r(self.drop_rate),
                "sandbox_reset_p50_s": r(self.reset_p50_s), "sandbox_step_p50_s": r(self.step_p50_s),
                "clean_tasks": len(self.clean_tasks)}

    @classmethod
    def from_trajectories(cls, batch_id: str, trajectories: Sequence[Trajectory], dropped: Sequence[DroppedGroup],
                          n_tasks: int | None = None, policy_id: str = "") -> "BatchFigures":
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
        clean = {task: (statistics.fmean(t.reward for t in ts), statistics.fmean(float(t.resolved) for t in ts))
                 for task, ts in by_task.items() if all(t.infra_retries == 0 for t in ts)}
        tasks = n_tasks if n_tasks is not None else len(by_task) + len({g.task_id for g in dropped})
        policy = policy_id or (trajectories[0].policy_id if trajectories else "")
        return cls(batch_id, policy, tasks, len(trajectories), attempts, faults,
                   sum(1 for t in trajectories if t.infra_retries), len(dropped),
                   statistics.median(resets) if resets else None, statistics.median(steps) if steps else None, clean)

    @classmethod
    def from_store(cls, store: TrajectoryStore) -> "BatchFigures":
        manifest = store.manifest() or {}
        tasks = manifest.get("tasks")
        return cls.from_trajectories(store.batch_id, store.trajectories(), store.dropped(),
                                     len(tasks) if tasks is not None else None, manifest.get("policy_id", ""))


@dataclass
class HealthVerdict:
    verdict: str
    batch_id: str
    baseline_batch_id: str | None
    infra_findings: list[str]
    policy_findings: list[str]
    figures: dict[str, Any]
    thresholds: HealthThresholds = field(default_factory=HealthThresholds)

    @property
    def healthy(self) -> bool:
        return self.verdict == HEALTHY

    def as_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "batch_id": self.batch_id, "baseline_batch_id": self.baseline_batch_id,
                "infra_findings": list(self.infra_findings), "policy_findings": list(self.policy_findings),
                "figures": self.figures, "thresholds": asdict(self.thresholds)}

    def summary(self) -> str:
        why = "; ".join(self.infra_findings + self.policy_findings) or "no rule fired"
        base = self.baseline_batch_id or "no previous batch"
        return f"{self.batch_id}: {self.verdict} (vs {base}): {why}"


def _infra_findings(cur: BatchFigures, base: BatchFigures | None, th: HealthThresholds) -> list[str]:
    out = []
    if cur.fault_rate > th.max_fault_rate:
        out.append(f"fault rate {cur.fault_rate:.3f} > ceiling {th.max_fault_rate:.3f}")
    if base is None:
        return out
    if cur.fault_rate - base.fault_rate > th.max_fault_rate_increase:
        out.append(f"fault rate {base.fault_rate:.3f} -> {cur.fault_rate:.3f} "
                   f"(+{cur.fault_rate - base.fault_rate:.3f} > {th.max_fault_rate_increase:.3f})")
    if cur.retry_rate - base.retry_rate > th.max_retry_rate_increase:
        out.append(f"retried trajectories {base.retry_rate:.3f} -> {cur.retry_rate:.3f} "
                   f"(+{cur.retry_rate - base.retry_rate:.3f} > {th.max_retry_rate_increase:.3f})")
    if cur.drop_rate - base.drop_rate > th.max_drop_rate_increase:
        out.append(f"dropped groups {base.drop_rate:.3f} -> {cur.drop_rate:.3f} of the tasks")
    for name, a, b in (("sandbox reset p50", base.reset_p50_s, cur.reset_p50_s),
                       ("sandbox step p50", base.step_p50_s, cur.step_p50_s)):
        if a is None or b is None:
            continue
        if b - a >= th.min_latency_increase_s and b > a * th.max_latency_ratio:
            out.append(f"{name} {a * 1000:.0f} ms -> {b * 1000:.0f} ms (x{b / a if a else float('inf'):.1f})")
    return out


def _policy_side(cur: BatchFigures, base: BatchFigures | None, th: HealthThresholds) -> tuple[list[str], dict]:
    if base is None:
        return [], {"shared_clean_tasks": 0, "policy_judged": False}
    shared = sorted(set(cur.clean_tasks) & set(base.clean_tasks))
    figures: dict[str, Any] = {"shared_clean_tasks": len(shared)}
    if len(shared) < th.min_clean_tasks:
        figures["policy_judged"] = False
        return [], figures
    mean = lambda f, i: statistics.fmean(f.clean_tasks[t][i] for t in shared)  # noqa: E731
    reward_b, reward_c, p1_b, p1_c = mean(base, 0), mean(cur, 0), mean(base, 1), mean(cur, 1)
    figures.update({"policy_judged": True, "clean_reward_baseline": round(reward_b, 4),
                    "clean_reward": round(reward_c, 4), "clean_pass_at_1_baseline": round(p1_b, 4),
                    "clean_pass_at_1": round(p1_c, 4)})
    out = []
    if reward_b - reward_c > th.max_reward_drop:
        out.append(f"mean reward on {len(shared)} cleanly-run tasks {reward_b:.3f} -> {reward_c:.3f} "
                   f"(-{reward_b - reward_c:.3f} > {th.max_reward_drop:.3f})")
    if p1_b - p1_c > th.max_pass_at_1_drop:
        out.append(f"pass@1 on {len(shared)} cleanly-run tasks {p1_b:.3f} -> {p1_c:.3f} "
                   f"(-{p1_b - p1_c:.3f} > {th.max_pass_at_1_drop:.3f})")
    return out, figures


def judge(current: BatchFigures, baseline: BatchFigures | None,
          thresholds: HealthThresholds = HealthThresholds()) -> HealthVerdict:
    """The verdict of `current` against `baseline` (the previous batch on the same task set, or None)."""
    infra = _infra_findings(current, baseline, thresholds)
    policy, policy_figures = _policy_side(current, baseline, thresholds)
    verdict = BOTH if infra and policy else INFRA if infra else POLICY if policy else HEALTHY
    figures = {"current": current.summary(), "baseline": baseline.summary() if baseline else None, **policy_figures}
    return HealthVerdict(verdict, current.batch_id, baseline.batch_id if baseline else None, infra, policy, figures,
                         thresholds)


def judge_stores(current: TrajectoryStore, baseline: TrajectoryStore | None,
                 thresholds: HealthThresholds = HealthThresholds()) -> HealthVerdict:
    return judge(BatchFigures.from_store(current), BatchFigures.from_store(baseline) if baseline else None,
                 thresholds)


def store_at(location: str, batch_id: str) -> TrajectoryStore:
    """The store of a catalog row (`location` is `<root>/<batch_id>`)."""
    suffix = "/" + batch_id
    root = location[: -len(suffix)] if location.endswith(suffix) else location
    return TrajectoryStore(root, batch_id)


def catalog_verdicts(batches: Sequence[dict[str, Any]],
                     thresholds: HealthThresholds = HealthThresholds()) -> dict[str, HealthVerdict]:
    """Every batch's verdict against the batch registered before it on the same task-set version.

    `batches`: catalog rows (Catalog.rollout_batches(), oldest first)."""
    out: dict[str, HealthVerdict] = {}
    figures: dict[str, BatchFigures] = {}
    previous: dict[str, str] = {}
    for row in batches:
        bid = row["batch_id"]
        figures[bid] = BatchFigures.from_store(store_at(row["location"], bid))
        prev = previous.get(row["task_set_version"])
        out[bid] = judge(figures[bid], figures[prev] if prev else None, thresholds)
        previous[row["task_set_version"]] = bid
    return out


def round_health(batch: Any, previous: Any | None, thresholds: HealthThresholds = HealthThresholds()
                 ) -> dict[str, float]:
    """A training round's verdict as metrics (0/1 flags and the figures behind them), for the round's
    MLflow history: `batch` and `previous` are BatchResults of consecutive rounds' rollouts."""
    import logging

    verdict = judge_stores(batch.store, previous.store if previous is not None else None, thresholds)
    logging.getLogger("envforge.observe").info("round health", extra={"verdict": verdict.verdict,
                                                                     "health": verdict.as_json()})
    cur = verdict.figures["current"]
    return {"health_infra_anomaly": float(verdict.verdict in (INFRA, BOTH)),
            "health_policy_regression": float(verdict.verdict in (POLICY, BOTH)),
            "health_fault_rate": float(cur["fault_rate"]), "health_drop_rate": float(cur["drop_rate"]),
            "health_clean_tasks": float(cur["clean_tasks"])}


def thresholds_from_env(environ: dict[str, str] | None = None) -> HealthThresholds:
    """HealthThresholds with each field overridable as ENVFORGE_HEALTH_<FIELD> (e.g.
    ENVFORGE_HEALTH_MAX_REWARD_DROP=0.05): how the Dagster check and the run report are tuned."""
    from dataclasses import fields

    from envforge.settings import read_env

    env = read_env(environ)
    values = {f.name: getattr(env, f"health_{f.name}") for f in fields(HealthThresholds)}
    return HealthThresholds(**{name: value for name, value in values.items() if value is not None})


def batch_verdict(batches: Sequence[dict[str, Any]], batch_id: str,
                  thresholds: HealthThresholds | None = None) -> HealthVerdict:
    """The verdict of `batch_id` against the batch registered just before it on the same task-set version.

    `batches`: catalog rows (Catalog.rollout_batches(), oldest first)."""
    rows = {r["batch_id"]: r for r in batches}
    if batch_id not in rows:
        raise ValueError(f"rollout batch {batch_id!r} is not registered in the catalog")
    row = rows[batch_id]
    before = [r for r in batches if r["task_set_version"] == row["task_set_version"]]
    index = [r["batch_id"] for r in before].index(batch_id)
    prev = before[index - 1] if index else None
    return judge(BatchFigures.from_store(store_at(row["location"], batch_id)),
                 BatchFigures.from_store(store_at(prev["location"], prev["batch_id"])) if prev else None,
                 thresholds or thresholds_from_env())
