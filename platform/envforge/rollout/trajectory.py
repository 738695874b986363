"""What a rollout records: every turn of a trajectory, its grade, and why it ended.

A trajectory is either *complete* (the policy submitted, ran out of turns or time, or kept
sending malformed actions: all model outcomes, graded and kept) or it is never stored:
infrastructure faults restart it on a fresh sandbox, and a sample whose retry budget runs out
drops its whole group (recorded in `DroppedGroup`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

# Why an episode ended. All of them are model outcomes and get graded.
END_REASONS = ("submitted", "max_turns", "trajectory_timeout", "no_action")


@dataclass
class Turn:
    index: int
    text: str  # the assistant's text (reasoning around the action, or the raw malformed reply)
    tool_calls: list[dict[str, Any]]  # as the policy returned them (OpenAI format)
    action: dict[str, Any] | None  # the parsed action {"name": ..., args...}; None when malformed
    parse_error: str | None
    observation: str
    exit_code: int | None
    policy_s: float
    env_s: float
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str = "stop"  # the policy's: "length" when the turn hit max_tokens (truncated)


@dataclass
class Trajectory:
    batch_id: str
    task_id: str
    content_hash: str
    task_set_version: str
    policy_id: str
    policy_version: int
    sample_index: int
    seed: int
    instruction: str
    turns: list[Turn] = field(default_factory=list)
    end_reason: str = "submitted"
    final_diff: str = ""
    reward: float = 0.0
    resolved: bool = False
    verification: dict[str, Any] = field(default_factory=dict)
    failure_reasons: list[str] = field(default_factory=list)
    infra_retries: int = 0
    sandbox: dict[str, Any] = field(default_factory=dict)  # acquire_s, warm, image
    timings: dict[str, float] = field(default_factory=dict)  # reset_s, policy_s, env_s, verify_s, close_s, work_s
    started_at: float = 0.0
    duration_s: float = 0.0
    source: str = ""

    @property
    def trajectory_id(self) -> str:
        return trajectory_id(self.batch_id, self.task_id, self.sample_index)

    @property
    def group_id(self) -> str:
        return f"{self.batch_id}/{self.task_id}"

    @property
    def n_tokens(self) -> int:
        return sum(len(t.token_ids or []) for t in self.turns)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Trajectory":
        data = dict(data)
        data["turns"] = [Turn(**t) for t in data.get("turns", [])]
        return cls(**data)


def trajectory_id(batch_id: str, task_id: str, sample_index: int) -> str:
    return f"{batch_id}/{task_id}/{sample_index}"


def sample_seed(base_seed: int, task_id: str, sample_index: int) -> int:
    """A per-sample seed that does not depend on scheduling order (so reruns reproduce)."""
    digest = hashlib.sha256(f"{base_seed}:{task_id}:{sample_index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


@dataclass
class DroppedGroup:
    """A task whose group could not be completed: no sample of it is stored."""

    batch_id: str
    task_id: str
    reason: str
    attempts: dict[int, int]  # sample index -> infra attempts made
    completed_samples: list[int]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False)
