"""The outcome of grading one solution: a reward and the reasons behind it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class CheckpointResult:
    name: str
    passed: bool
    exit_code: int
    expected_exit: int
    stdout_matched: bool | None
    duration_s: float
    timed_out: bool = False
    output_tail: str = ""


@dataclass
class VerificationResult:
    """Reward plus machine-readable reasons (`test_failed:<id>`, `checkpoint_failed:<name>`, ...)."""

    task_id: str
    solution: str
    reward: float
    resolved: bool
    tests: dict[str, str] = field(default_factory=dict)
    checkpoints: list[CheckpointResult] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    patch_method: str | None = None
    duration_s: float = 0.0
    image: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
