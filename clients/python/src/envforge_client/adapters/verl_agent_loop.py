"""verl's multi-turn agent loop for envforge tasks: one environment-service session per trajectory.

verl (0.9.x) runs it for every row whose `agent_name` is `envforge_agent` (what
`envforge rollout-export --format verl` writes) once the trainer is told where the loop is:

    actor_rollout_ref.rollout.multi_turn.enable=True
    actor_rollout_ref.rollout.agent.agent_loop_config_path=<envforge_client/adapters/verl_agent_loop.yaml>

For each trajectory it opens a session on the row's exact task version (`extra_info.task_id` and
`content_hash`), lets verl's `ToolAgentLoop` machinery generate, parse `<tool_call>` blocks (verl's
hermes parser) and append turns, but runs every call as a step of that session, so the model reads
each observation as a tool turn (masked out of the loss). The episode ends when the model submits,
the session's turn budget or verl's `max_assistant_turns` / `response_length` runs out, or the model
answers without a call; an unfinished episode is verified then, and the session is closed.

The verified result travels in the output's `reward_scores` extra field, which verl hands to the
reward function as `extra_info["rollout_reward_scores"]`; `verl_reward.compute_score` /
`compute_score_batch` read it (nothing is replayed). The loop leaves `reward_score` unset so
verl's reward manager still runs and logs the result's fields.

Why a loop and not `BaseTool` classes in a tool config: verl 0.9.x's `ToolAgentLoop` creates and
releases a tool instance around every single call and never calls `calc_reward`, so a tool cannot
hold a session across a trajectory nor verify it at the end.

The service URL comes from the row (`extra_info.service_url`) or `ENVFORGE_SERVICE_URL`, the key
only from `ENVFORGE_API_KEY`. A lost session or an unavailable service raises (after the client's
retries): a lost sandbox is not a model failure, so it must not be scored 0.
"""

from __future__ import annotations

import json
import os
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop
from verl.experimental.agent_loop.tool_parser import FunctionCall
from verl.tools.schemas import ToolResponse

from envforge_client.adapters.verl_reward import RESULT_KEY
from envforge_client.client import KEY_VARIABLE, AsyncClient, AsyncSession
from envforge_client.models import VerifyResult

AGENT_NAME = "envforge_agent"  # the export's agent_name (envforge.rollout.verl_export)


def session_result(session: AsyncSession, result: VerifyResult, steps: int, end_reason: str | None) -> dict[str, Any]:
    """What the reward function needs from a finished session (plain types: verl stores it in numpy
    object arrays and logs it)."""
    return {
        "score": float(result.reward),
        "resolved": bool(result.resolved),
        "steps": steps,
        "submitted": end_reason == "submitted",
        "end_reason": end_reason or "unfinished",
        "reasons": ";".join(result.reasons),
        "session_id": session.id,
        "task_id": result.task_id,
    }


@register(AGENT_NAME)
class EnvforgeAgentLoop(ToolAgentLoop):
    """verl's `ToolAgentLoop` whose tools are the actions of one envforge session.

    verl builds one instance per trajectory (`hydra.utils.instantiate` in `AgentLoopWorker`), so the
    session lives on the instance. Tools from a verl tool config are not used: the row's system
    prompt already lists envforge's tools and the `<tool_call>` form."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tools, self.tool_schemas = {}, []
        self._session: AsyncSession | None = None
        self._steps = 0
        self._end_reason: str | None = None  # submitted, max_turns or trajectory_timeout once the session ends

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        extra_info = dict(kwargs.get("extra_info") or {})
        task_id, content_hash = extra_info.get("task_id"), extra_info.get("content_hash")
        if not task_id or not content_hash:
            raise ValueError(
                f"row {extra_info.get('index')!r}: extra_info needs task_id and content_hash for the "
                f"{AGENT_NAME} agent loop (write the data with `envforge rollout-export --format verl`)"
            )
        if not os.environ.get(KEY_VARIABLE):
            raise RuntimeError(f"{KEY_VARIABLE} is not set: the {AGENT_NAME} loop needs an envforge service key")
        async with AsyncClient(extra_info.get("service_url")) as client:  # else ENVFORGE_SERVICE_URL
            session = await client.create_session(task_id=task_id, content_hash=content_hash)
            async with session:
                self._session = session
                output = await super().run(sampling_params, **kwargs)
                # an episode that ended (submit, turn budget) carries its grade; an unfinished one is graded now
                result = session.result if session.done and session.result else (await session.verify()).result
                scores = dict(output.extra_fields.get("reward_scores") or {})
                scores[RESULT_KEY] = session_result(session, result, self._steps, self._end_reason)
                output.extra_fields["reward_scores"] = scores
        return output

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> AgentState:
        state = await super()._handle_processing_tools_state(agent_data)
        return AgentState.TERMINATED if self._session is not None and self._session.done else state

    async def _call_tool(
        self, tool_call: FunctionCall, tools_kwargs: dict[str, Any], agent_data: AgentData
    ) -> tuple[ToolResponse, float, dict]:
        """One step of the session; its observation is the tool turn the model reads next."""
        session = self._session
        assert session is not None, "the session opens in run()"
        if session.done:  # a call after submit in the same reply: the episode is over
            return ToolResponse(text="The episode has ended."), 0.0, {}
        try:
            arguments = json.loads(tool_call.arguments or "{}")
        except json.JSONDecodeError:
            arguments = tool_call.arguments  # the service answers malformed arguments with an error observation
        out = await session.step(name=tool_call.name, arguments=arguments)
        self._steps += 1
        self._end_reason = out.end_reason
        return ToolResponse(text=out.observation.text), 0.0, {"turn": out.turn, "done": out.done}
