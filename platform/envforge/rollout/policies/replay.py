"""The replay policy: acts out a task's reference solution through the tool interface.

It is how validation and tests drive the whole rollout loop (environment, scheduler, store)
with a known outcome: every trajectory should be resolved, and the same tasks must give the
same rewards on every run. A patch reference becomes one `apply_patch`, a commands reference
one `run` per command; then `submit`.
"""

from __future__ import annotations

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


class ReplayEpisode:
    def __init__(self, task: Task, as_text: bool = False):
        self.actions = reference_actions(task)
        self.as_text = as_text
        self.policy_id = "replay"
        self.version = 0

    async def act(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], *, seed: int,
                  temperature: float = 1.0, max_tokens: int = 512) -> PolicyOutput:
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        action = self.actions[min(turn, len(self.actions) - 1)]
        if self.as_text:
            return PolicyOutput(text=to_text(action))
        return PolicyOutput(tool_calls=[to_tool_call(action, f"call_{turn}")])

    async def aclose(self) -> None:
        return None


class ReplayPolicy:
    """Policy factory: `episode(task)` gives the per-trajectory actor the scheduler uses."""

    policy_id = "replay"
    version = 0

    def __init__(self, as_text: bool = False):
        self.as_text = as_text

    def episode(self, task: Task) -> ReplayEpisode:
        return ReplayEpisode(task, self.as_text)

    async def act(self, *args, **kwargs) -> PolicyOutput:
        raise TypeError("the replay policy acts per task: use policy.episode(task).act(...)")

    async def aclose(self) -> None:
        return None
