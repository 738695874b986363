"""The replay policy: acts out a task's reference solution through the tool interface.

It is how validation and tests drive the whole rollout loop (environment, scheduler, store)
with a known outcome: every trajectory should be resolved, and the same tasks must give the
same rewards on every run. A patch reference becomes one `apply_patch`, a commands reference
one `run` per command; then `submit`.

With `skip_rate` > 0 it is a deliberately worse policy, for canaries and the infra-vs-policy
verdict's tests: that share of its episodes (chosen from the episode's seed, so reruns and
infrastructure retries skip the same ones) submit without applying the solution.
"""

from __future__ import annotations

import random
from typing import Any

from envforge.rollout.actions import Action, ApplyPatch, Run, Submit, to_text, to_tool_call
from envforge.rollout.policies.base import PolicyOutput
from envforge.task import Task


def reference_actions(task: Task) -> list[Action]:
    if task.reference_patch is not None:
        steps: list[Action] = [ApplyPatch(task.reference_patch)]
    else:
        steps = [Run(cmd) for cmd in task.spec.reference_solution.commands or []]
    return [*steps, Submit()]


def replay_policy_id(skip_rate: float) -> str:
    return "replay" if not skip_rate else f"replay-skip{skip_rate:g}"


class ReplayEpisode:
    def __init__(self, task: Task, as_text: bool = False, skip_rate: float = 0.0):
        self.actions = reference_actions(task)
        self.as_text = as_text
        self.skip_rate = skip_rate
        self.policy_id = replay_policy_id(skip_rate)
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
        if turn == 0 and self.skip_rate and random.Random(seed).random() < self.skip_rate:
            self.actions = [self.actions[-1]]  # submit at once: the solution is dropped
        action = self.actions[min(turn, len(self.actions) - 1)]
        if self.as_text:
            return PolicyOutput(text=to_text(action))
        return PolicyOutput(tool_calls=[to_tool_call(action, f"call_{turn}")])

    async def aclose(self) -> None:
        return None


class ReplayPolicy:
    """Policy factory: `episode(task)` gives the per-trajectory actor the scheduler uses."""

    version = 0

    def __init__(self, as_text: bool = False, skip_rate: float = 0.0):
        if not 0.0 <= skip_rate <= 1.0:
            raise ValueError(f"ReplayPolicy.skip_rate: must be within [0, 1], got {skip_rate}")
        self.as_text = as_text
        self.skip_rate = skip_rate
        self.policy_id = replay_policy_id(skip_rate)

    def episode(self, task: Task) -> ReplayEpisode:
        return ReplayEpisode(task, self.as_text, self.skip_rate)

    async def act(self, *args, **kwargs) -> PolicyOutput:
        raise TypeError("the replay policy acts per task: use policy.episode(task).act(...)")

    async def aclose(self) -> None:
        return None
