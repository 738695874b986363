"""The flakiness gate's settings: one typed config for the CLI, the Dagster run config and MLflow params.

Kept apart from the gate so reading it (the CLI builds its options from it) imports nothing heavy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


def _default_runs() -> int:
    return int(os.environ.get("ENVFORGE_GATE_RUNS", "5"))


@dataclass
class GateConfig:
    """Gate parameters. `as_params()` (what decides a verdict) is part of a task-set version and of a
    verdict's key; `workers`, `concurrency` and `force` change only how long gating takes."""

    runs: int = field(default_factory=_default_runs,
                      metadata={"help": "gradings of the empty and of the reference solution, each "
                                        "(default: $ENVFORGE_GATE_RUNS or 5)"})
    shuffle: bool = field(default=True, metadata={
        "help": "the order check: the reference once more, on the whole suite, in reversed order"})
    probes: bool = field(default=True, metadata={"help": "run the reward-hacking probes that apply to each task"})
    full_suite: bool = field(default=False, metadata={
        "help": "the exhaustive gate: the whole suite on every grading, every run and probe graded even after a "
                "disagreement, no shared copies"})
    workers: int = field(default=2, metadata={"help": "gradings of one task in parallel (verdicts do not depend on it)"})
    concurrency: int = field(default=2, metadata={"help": "tasks gated at once (one warm sandbox pool)"})
    force: bool = field(default=False, metadata={
        "help": "re-gate tasks whose content, image and gate parameters are unchanged (by default they keep "
                "their verdict)"})

    def __post_init__(self) -> None:
        for name in ("runs", "workers", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"GateConfig.{name}: must be at least 1, got {getattr(self, name)}")

    def as_params(self) -> dict:
        """What a verdict depends on (recorded with it, and in the task-set version)."""
        return {"gate": "flakiness", "runs": self.runs, "shuffle": self.shuffle, "probes": self.probes,
                "full_suite": self.full_suite}
