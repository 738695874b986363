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

This module judges plain figures (`BatchFigures`) and imports no domain package: reading them
from a batch's stored trajectories, and the verdicts of the catalog's batches, are
`envforge.rollout.health`'s.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

HEALTHY, INFRA, POLICY, BOTH = "healthy", "infrastructure anomaly", "policy regression", "both"
VERDICTS = (HEALTHY, INFRA, POLICY, BOTH)


@dataclass(frozen=True)
class HealthThresholds:
    """When a change between two batches counts. Rates are shares (0..1), latencies seconds."""

    max_fault_rate_increase: float = field(
        default=0.05,
        metadata={"help": "infrastructure faults per attempt may grow by at most this much over the previous batch"},
    )
    max_fault_rate: float = field(
        default=0.2,
        metadata={"help": "infrastructure faults per attempt above this are an anomaly even without a previous batch"},
    )
    max_retry_rate_increase: float = field(
        default=0.1, metadata={"help": "the share of trajectories that needed a retry may grow by at most this much"}
    )
    max_drop_rate_increase: float = field(
        default=0.0,
        metadata={"help": "the share of groups dropped may grow by at most this much (0: any new drop counts)"},
    )
    max_latency_ratio: float = field(
        default=2.0, metadata={"help": "median sandbox reset or per-step time may grow by at most this factor ..."}
    )
    min_latency_increase_s: float = field(
        default=0.1,
        metadata={
            "help": "... and a latency rule fires only when the median also grew by this many seconds (noise floor)"
        },
    )
    max_reward_drop: float = field(
        default=0.1, metadata={"help": "mean reward on the shared cleanly-run tasks may fall by at most this much"}
    )
    max_pass_at_1_drop: float = field(
        default=0.1, metadata={"help": "pass@1 on the shared cleanly-run tasks may fall by at most this much"}
    )
    min_clean_tasks: int = field(
        default=2, metadata={"help": "the policy side is judged only on at least this many shared cleanly-run tasks"}
    )

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value < 0:
                raise ValueError(f"HealthThresholds.{name}: must be >= 0, got {value}")
        if self.max_latency_ratio < 1:
            raise ValueError(f"HealthThresholds.max_latency_ratio: must be >= 1, got {self.max_latency_ratio}")


@dataclass
class BatchFigures:
    """What one batch's infrastructure and policy did (`rollout.health` reads it from the batch's store)."""

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
        return {
            "batch_id": self.batch_id,
            "policy_id": self.policy_id,
            "tasks": self.tasks,
            "trajectories": self.trajectories,
            "attempts": self.attempts,
            "infra_faults": self.infra_faults,
            "fault_rate": r(self.fault_rate),
            "retry_rate": r(self.retry_rate),
            "dropped_groups": self.dropped_groups,
            "drop_rate": r(self.drop_rate),
            "sandbox_reset_p50_s": r(self.reset_p50_s),
            "sandbox_step_p50_s": r(self.step_p50_s),
            "clean_tasks": len(self.clean_tasks),
        }


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
        return {
            "verdict": self.verdict,
            "batch_id": self.batch_id,
            "baseline_batch_id": self.baseline_batch_id,
            "infra_findings": list(self.infra_findings),
            "policy_findings": list(self.policy_findings),
            "figures": self.figures,
            "thresholds": asdict(self.thresholds),
        }

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
        out.append(
            f"fault rate {base.fault_rate:.3f} -> {cur.fault_rate:.3f} "
            f"(+{cur.fault_rate - base.fault_rate:.3f} > {th.max_fault_rate_increase:.3f})"
        )
    if cur.retry_rate - base.retry_rate > th.max_retry_rate_increase:
        out.append(
            f"retried trajectories {base.retry_rate:.3f} -> {cur.retry_rate:.3f} "
            f"(+{cur.retry_rate - base.retry_rate:.3f} > {th.max_retry_rate_increase:.3f})"
        )
    if cur.drop_rate - base.drop_rate > th.max_drop_rate_increase:
        out.append(f"dropped groups {base.drop_rate:.3f} -> {cur.drop_rate:.3f} of the tasks")
    for name, a, b in (
        ("sandbox reset p50", base.reset_p50_s, cur.reset_p50_s),
        ("sandbox step p50", base.step_p50_s, cur.step_p50_s),
    ):
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
    figures.update(
        {
            "policy_judged": True,
            "clean_reward_baseline": round(reward_b, 4),
            "clean_reward": round(reward_c, 4),
            "clean_pass_at_1_baseline": round(p1_b, 4),
            "clean_pass_at_1": round(p1_c, 4),
        }
    )
    out = []
    if reward_b - reward_c > th.max_reward_drop:
        out.append(
            f"mean reward on {len(shared)} cleanly-run tasks {reward_b:.3f} -> {reward_c:.3f} "
            f"(-{reward_b - reward_c:.3f} > {th.max_reward_drop:.3f})"
        )
    if p1_b - p1_c > th.max_pass_at_1_drop:
        out.append(
            f"pass@1 on {len(shared)} cleanly-run tasks {p1_b:.3f} -> {p1_c:.3f} "
            f"(-{p1_b - p1_c:.3f} > {th.max_pass_at_1_drop:.3f})"
        )
    return out, figures


def judge(
    current: BatchFigures, baseline: BatchFigures | None, thresholds: HealthThresholds = HealthThresholds()
) -> HealthVerdict:
    """The verdict of `current` against `baseline` (the previous batch on the same task set, or None)."""
    infra = _infra_findings(current, baseline, thresholds)
    policy, policy_figures = _policy_side(current, baseline, thresholds)
    verdict = BOTH if infra and policy else INFRA if infra else POLICY if policy else HEALTHY
    figures = {"current": current.summary(), "baseline": baseline.summary() if baseline else None, **policy_figures}
    return HealthVerdict(
        verdict, current.batch_id, baseline.batch_id if baseline else None, infra, policy, figures, thresholds
    )


def thresholds_from_env(environ: dict[str, str] | None = None) -> HealthThresholds:
    """HealthThresholds with each field overridable as ENVFORGE_HEALTH_<FIELD> (e.g.
    ENVFORGE_HEALTH_MAX_REWARD_DROP=0.05): how the Dagster check and the run report are tuned."""
    from dataclasses import fields

    from envforge.settings import read_env

    env = read_env(environ)
    values = {f.name: getattr(env, f"health_{f.name}") for f in fields(HealthThresholds)}
    return HealthThresholds(**{name: value for name, value in values.items() if value is not None})
