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
    """Gate parameters; all but `concurrency` are part of a task-set version."""

    runs: int = field(default_factory=_default_runs,
                      metadata={"help": "grades of the empty and of the reference solution, each "
                                        "(default: $ENVFORGE_GATE_RUNS or 5)"})
    shuffle: bool = field(default=True, metadata={"help": "one more reference run with the test order shuffled"})
    probes: bool = field(default=True, metadata={"help": "run the standard reward-hacking probes"})
    concurrency: int = field(default=2, metadata={"help": "tasks gated at once (one warm sandbox pool)"})

    def as_params(self) -> dict:
        """What a verdict depends on (recorded with it, and in the task-set version)."""
        return {"gate": "flakiness", "runs": self.runs, "shuffle": self.shuffle, "probes": self.probes}
