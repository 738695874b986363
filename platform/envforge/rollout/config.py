"""How a rollout batch samples: one typed config for the CLI, the Dagster run config and MLflow params.

Kept apart from the scheduler so reading it (the CLI builds its options from it) imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RolloutConfig:
    """How a batch samples: the settings of the rollout stage, and what training builds its rollouts with."""

    n_samples: int = field(
        default=4, metadata={"help": "samples per task (the GRPO group size)", "cli": ("--samples", "-n")}
    )
    concurrency: int = field(default=8, metadata={"help": "trajectories at once"})
    max_infra_retries: int = field(default=3, metadata={"help": "per trajectory, on a fresh sandbox each time"})
    backoff_s: float = field(default=0.5, metadata={"help": "first wait before an infrastructure retry"})
    backoff_max_s: float = field(default=8.0, metadata={"help": "longest wait between retries"})
    seed: int = field(default=0, metadata={"help": "a sample's seed derives from (seed, task, sample)"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature"})
    max_tokens: int = field(default=512, metadata={"help": "completion tokens per turn"})
    max_turns: int | None = field(
        default=None, metadata={"help": "turns per trajectory (default: the task's max_turns)"}
    )
    engine_wait_s: float = field(
        default=120.0,
        metadata={
            "help": "after an infrastructure fault, how long to wait "
            "for the Docker engine to answer again before "
            "retrying (a dockerd restart takes seconds)"
        },
    )
    max_dropped_fraction: float = field(
        default=0.1,
        metadata={
            "help": "a batch that dropped more than this fraction of its groups (infrastructure faults outlasted the "
            "retries) has failed: `envforge rollout` exits 3"
        },
    )

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_dropped_fraction <= 1.0:
            raise ValueError(f"max_dropped_fraction must be between 0 and 1, not {self.max_dropped_fraction}")

    def as_params(self) -> dict[str, Any]:
        return dict(self.__dict__)
