"""What the trainers consume: one assistant turn as (prompt ids, completion ids), with RL extras.

Both SFT and GRPO train on *turns*: the prompt is exactly what the policy saw (the chat
template over the conversation so far, tools included), the completion exactly what it
emitted (its token ids, stop token included). The loss only ever covers completion tokens:
prompts and observations are never trained on.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TurnSample:
    prompt_ids: list[int]
    completion_ids: list[int]
    behaviour_logprobs: list[float] | None = None  # RL: log-prob of each completion token when it was sampled
    advantage: float = 0.0  # RL: the trajectory's group-normalized advantage (same for all its turns)
    reward: float = 0.0
    group_id: str = ""  # RL: task group (batch/task)
    trajectory_id: str = ""
    policy_version: int = 0  # RL: the policy checkpoint version that sampled it
    truncated: bool = False  # RL: the completion hit the token budget (no stop token): see GRPOConfig.truncated

    def __post_init__(self) -> None:
        if not self.completion_ids:
            raise ValueError("a turn sample needs at least one completion token")
        if self.behaviour_logprobs is not None and len(self.behaviour_logprobs) != len(self.completion_ids):
            raise ValueError("behaviour_logprobs must have one entry per completion token")

    @property
    def n_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)
