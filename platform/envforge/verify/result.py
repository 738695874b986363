"""The outcome of grading one solution: a reward and the reasons behind it.

`as_json()` is the result object users and the CLI see. Everything in it is deterministic
for the same diff except `duration_s` and `logs` (command output tails, which can carry
timings), so determinism checks compare `comparable()`.
"""

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

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "passed": self.passed,
            "exit_code": self.exit_code,
            "expected_exit": self.expected_exit,
            "stdout_matched": self.stdout_matched,
            "timed_out": self.timed_out,
        }


@dataclass
class VerificationResult:
    """Reward plus machine-readable reasons.

    reasons: patch_failed, test_patch_failed, test_failed:<id>, test_missing:<id>,
    checkpoint_failed:<name>, protected_path_modified:<path>, report_missing,
    report_unreadable, timeout, oom, solution_command_failed:<n>. `resolved` ignores
    protected_path_modified (the change was not applied) unless the task zeroes the reward
    for it. Infrastructure faults are not results: they raise InfraError (see grader).
    """

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
    infra_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def as_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "reward": self.reward,
            "resolved": self.resolved,
            "tests": dict(self.tests),
            "checkpoints": [c.as_json() for c in self.checkpoints],
            "reasons": list(self.reasons),
            "patch_method": self.patch_method,
            "infra_error": self.infra_error,
            "duration_s": round(self.duration_s, 3),
            "logs": {c.name: c.output_tail for c in self.checkpoints},
        }

    def comparable(self) -> dict[str, Any]:
        doc = self.as_json()
        doc.pop("duration_s")
        doc.pop("logs")
        return doc
