"""Training data from the same loop the policy runs in.

- **SFT demonstrations** are rollouts of a *teacher*: the replay policy (the task's reference
  solution through the tools) with every turn tokenized by the student's own chat template,
  exactly as the student would have seen and emitted it. So demonstrations and rollouts share
  one format (tool definitions, observations, `<tool_call>` text, stop token), and SFT
  examples are the teacher batch's turns.
- **RL batches** are the trajectory store's complete groups: each turn's recorded prompt ids,
  completion ids and behaviour log-probs, with the trajectory's reward.

Only completion tokens (what the policy emitted) are ever trained on.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

from envforge.rollout.actions import to_text
from envforge.rollout.policies.base import IM_END, PolicyOutput
from envforge.rollout.policies.render import render_prompt
from envforge.rollout.policies.replay import reference_actions
from envforge.rollout.trajectory import Trajectory
from envforge.task import Task
from envforge.train.samples import TurnSample


class TeacherEpisode:
    """Acts out one task's reference solution as plain-text tool calls, tokenized for the student."""

    def __init__(self, task: Task, tokenizer: Any, policy_id: str):
        self.actions = reference_actions(task)
        self.tokenizer = tokenizer
        self.policy_id = policy_id
        self.version = 0

    async def act(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        seed: int,
        temperature: float = 1.0,
        max_tokens: int = 512,
    ) -> PolicyOutput:
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        action = self.actions[min(turn, len(self.actions) - 1)]
        text = to_text(action)
        completion = list(self.tokenizer.encode(text, add_special_tokens=False))
        completion.append(self.tokenizer.convert_tokens_to_ids(IM_END))
        return PolicyOutput(
            text=text, prompt_token_ids=render_prompt(self.tokenizer, messages, tools), token_ids=completion
        )

    async def aclose(self) -> None:
        return None


class TeacherPolicy:
    """Policy factory for demonstration rollouts (see the module docstring)."""

    def __init__(self, tokenizer: Any, policy_id: str = "teacher"):
        self.tokenizer = tokenizer
        self.policy_id = policy_id
        self.version = 0

    def episode(self, task: Task) -> TeacherEpisode:
        return TeacherEpisode(task, self.tokenizer, self.policy_id)

    async def act(self, *args, **kwargs) -> PolicyOutput:
        raise TypeError("the teacher acts per task: use policy.episode(task).act(...)")

    async def aclose(self) -> None:
        return None


def in_canonical_order(trajectories: Iterable[Trajectory]) -> list[Trajectory]:
    """Trajectories by (group, sample index): what training reads does not depend on finishing order."""
    return sorted(trajectories, key=lambda t: (t.group_id, t.sample_index, t.trajectory_id))


def turn_samples(trajectories: Iterable[Trajectory], only_resolved: bool = False) -> list[TurnSample]:
    """Every turn with recorded tokens as a sample (SFT); unresolved demonstrations can be left out.

    In a canonical order (group, sample index), not the order the rollouts finished in: SFT's data
    order is a seeded permutation of this list, so a run must not depend on which sandbox was
    faster (it did: the same seed gave different SFT checkpoints on a loaded machine)."""
    out = []
    for t in in_canonical_order(trajectories):
        if only_resolved and not t.resolved:
            continue
        for turn in t.turns:
            if turn.prompt_token_ids and turn.token_ids:
                out.append(
                    TurnSample(
                        list(turn.prompt_token_ids),
                        list(turn.token_ids),
                        behaviour_logprobs=list(turn.logprobs) if turn.logprobs else None,
                        reward=t.reward,
                        group_id=t.group_id,
                        trajectory_id=t.trajectory_id,
                        policy_version=t.policy_version,
                        truncated=turn.finish_reason == "length",
                    )
                )
    return out


def rl_groups(trajectories: Iterable[Trajectory]) -> dict[str, list[tuple[float, list[TurnSample]]]]:
    """{group id: [(reward, the trajectory's turn samples)]} for trajectories whose every turn has
    tokens and behaviour log-probs (a turn without them cannot be trained on by GRPO). In the same
    canonical order as `turn_samples`, so an update does not depend on which group finished first."""
    groups: dict[str, list[tuple[float, list[TurnSample]]]] = defaultdict(list)
    incomplete: set[str] = set()
    for t in in_canonical_order(trajectories):
        samples = turn_samples([t])
        if not samples or len(samples) != len(t.turns) or any(s.behaviour_logprobs is None for s in samples):
            incomplete.add(t.group_id)  # one untrainable member makes the whole group unusable
            continue
        groups[t.group_id].append((t.reward, samples))
    return {g: members for g, members in groups.items() if g not in incomplete}
