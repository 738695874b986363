"""verifiers (0.4, `verifiers.v1`) environments on envforge: a taskset whose tasks are a service task set's
tasks, and a multi-turn env that plays each rollout on one envforge session and scores it with the
service's verified reward.

verifiers 0.4 has no `MultiTurnEnv`/`Rubric` any more: an environment is a package exporting its `Taskset`
(the rows), optionally its `Env` (how one task becomes one episode) and the task's `@vf.reward` methods
(the rubric). `vf-eval <id>` imports the module named by the id, so the installable module is the
top-level `envforge_verifiers` (this package's shim re-exporting these classes):

    ENVFORGE_API_KEY=... OPENAI_API_KEY=... vf-eval envforge-verifiers \\
        --env.taskset.url http://127.0.0.1:8080 --env.taskset.task-set main \\
        -m <model> --client.base-url http://127.0.0.1:8000/v1 --client.api-key-var OPENAI_API_KEY --no-push

The env plays the user's side, as verifiers' own OpenEnv env does: it opens the session, hands the task's
prompt to the agent, passes every tool call of each reply (native OpenAI tool calls, else each
`<tool_call>` block of the text, else the text itself, which the service answers with a "no tool call"
observation) to the session, and answers with the observations, until the session is done (submit,
max turns, trajectory timeout) or the agent stops. A session not ended by submit is graded with verify.
The session is always closed (errors and cancellation included). An infrastructure fault (session lost,
sandbox fault, a grade with `infra_error`) raises, so verifiers records an errored episode, never a 0.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import verifiers.v1 as vf

from envforge_client.client import AsyncClient, AsyncSession, Client
from envforge_client.errors import ServiceError
from envforge_client.models import VerifyResult
from envforge_client.prompts import system_message, tool_call_blocks, user_message

logger = logging.getLogger(__name__)
INFO = "envforge"  # trace.info key holding the session's id and verification result


class EnvforgeInfraError(RuntimeError):
    """The service could not grade the rollout (its sandbox failed): the episode errors, it is not scored."""


class EnvforgeTasksetConfig(vf.TasksetConfig):
    url: str | None = None
    """Environment service URL (None = $ENVFORGE_SERVICE_URL, else http://127.0.0.1:8080). The key is
    read from $ENVFORGE_API_KEY only, so it never lands in a run's saved config or traces."""
    task_set: str = "main"
    """The service task set whose tasks are the rows."""
    split: str | None = None
    """Only tasks of this split (train / eval / audit) when the task set was tiered."""
    max_turns: int | None = None
    """Session turn cap (None = `--env.agent.max-turns` when set, else each task's own)."""


class EnvforgeData(vf.TaskData):
    url: str
    task_id: str
    content_hash: str
    task_set_version: str
    max_turns: int | None = None


@dataclass
class _Episode:
    """One rollout's live session, found by the task's hooks through the rollout's trace id."""

    session: AsyncSession
    turn: int = 0
    end_reason: str | None = None
    answered: dict[str, str] = field(default_factory=dict)  # tool call id -> observation text

    async def step(self, **body: Any) -> str:
        out = await self.session.step(**body)
        self.turn = out.turn
        if out.done:
            self.end_reason = out.end_reason
        return observation_text(out.observation)


_LIVE: dict[str, _Episode] = {}  # trace id -> its episode, while `EnvforgeEnv.run` plays it


class EnvforgeTask(vf.Task[EnvforgeData]):
    @property
    def key(self) -> str:
        """The task's content hash: the exact task version, stable across runs and task-set versions."""
        return self.data.content_hash

    @vf.intercept
    async def envforge_tool_call(self, request: vf.Request, trace: vf.Trace) -> vf.Request | None:
        """Native tool calls run on the session: verifiers' tool gate asks about each call the model makes
        (an empty tool result at the tail) before the agent's program would run it; the answer is the
        session's observation, which the model sees as that call's result."""
        episode = _LIVE.get(trace.id)
        last = request.messages[-1] if request.messages else None
        if episode is None or not isinstance(last, vf.ToolMessage) or last.content:
            return None
        call = _tool_call(request.messages, last.tool_call_id)
        if call is None:
            return None
        if call.id not in episode.answered:
            if episode.session.done:
                episode.answered[call.id] = "The episode has ended; nothing more runs."
            else:
                body = {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                episode.answered[call.id] = await episode.step(tool_call=body)
        answered = last.model_copy(update={"content": episode.answered[call.id]})
        return request.model_copy(update={"messages": [*request.messages[:-1], answered]})

    @vf.stop
    def envforge_done(self, trace: vf.Trace) -> bool:
        """The session ended (submit, max turns, trajectory timeout) during the agent's turn."""
        episode = _LIVE.get(trace.id)
        return episode is not None and episode.session.done

    @vf.reward(weight=1.0)
    async def envforge_reward(self, trace: vf.Trace) -> float:
        """The service verifier's reward for the session this rollout played (recorded by `EnvforgeEnv`)."""
        played = trace.info.get(INFO)
        if not played or "reward" not in played:
            raise RuntimeError(
                f"task {self.data.task_id}: no envforge verification on this trace (the rollout ended before "
                "its session was graded); the episode is not scored"
            )
        return float(played["reward"])


def _tool_call(messages: list[Any], call_id: str) -> vf.ToolCall | None:
    for message in reversed(messages):
        if isinstance(message, vf.AssistantMessage) and message.tool_calls:
            return next((c for c in message.tool_calls if c.id == call_id), None)
    return None


class EnvforgeTaskset(vf.Taskset[EnvforgeTask, EnvforgeTasksetConfig]):
    def load(self) -> Iterator[EnvforgeTask]:
        config = self.config
        with Client(config.url) as client:
            listing = client.tasks(config.task_set)
            url = client.base_url
        system = system_message()
        for t in listing.tasks:
            if config.split is not None and t.split not in (config.split, None):
                continue
            yield EnvforgeTask(
                EnvforgeData(
                    id=t.task_id,
                    name=t.task_id,
                    prompt=user_message(t.instruction),
                    system_prompt=system,
                    url=url,
                    task_id=t.task_id,
                    content_hash=t.content_hash,
                    task_set_version=listing.task_set.version,
                    max_turns=config.max_turns,
                ),
                config.task,
            )


class EnvforgeEnvConfig(vf.EnvConfig):
    # Tools are the session's, run host-side by this env: the agent is a plain chat program (no tools of
    # its own, nothing executed on the machine), in a local process.
    agent: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"}, runtime=vf.SubprocessConfig())
    """The policy's seat; `--env.agent.*` overrides (sampling, max_turns, ...)."""


def actions(reply: str) -> list[dict[str, Any]]:
    """The step bodies of a text reply, in order: each `<tool_call>` block, else the text itself (the
    service answers it with an error observation naming the missing tool call). Native tool calls never
    get here: `EnvforgeTask.envforge_tool_call` runs them inside the agent's turn."""
    return [{"text": block} for block in tool_call_blocks(reply)] or [{"text": reply}]


def observation_text(obs: Any) -> str:
    text = obs.text or ""
    if obs.error:
        text = f"{text}\n[error] {obs.error}" if text else f"[error] {obs.error}"
    if obs.exit_code is not None:
        text = f"[exit code {obs.exit_code}]\n{text}"
    return text.strip() or "(no output)"


def _check_graded(task_id: str, session_id: str, result: VerifyResult) -> VerifyResult:
    if result.infra_error:
        raise EnvforgeInfraError(
            f"task {task_id}, session {session_id}: the service could not grade it ({result.infra_error}); "
            "not a model failure, the episode is not scored"
        )
    return result


async def _close(session: AsyncSession) -> None:
    """Close even when the rollout is being cancelled: the close runs in its own task, which a second
    cancellation of the caller does not stop. A service that cannot be reached cannot be told: its idle
    reaper frees the sandbox; the failure is logged, not raised over the rollout's own outcome."""
    try:
        await asyncio.shield(asyncio.ensure_future(session.close()))
    except ServiceError as exc:
        logger.warning("envforge session %s could not be closed (%s); the service reaps it when idle", session.id, exc)


class EnvforgeEnv(vf.Env[EnvforgeEnvConfig]):
    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        data = task.data
        assert isinstance(data, EnvforgeData), f"EnvforgeEnv runs envforge tasks, got {type(data).__name__}"
        async with AsyncClient(data.url) as client:
            # The agent's turn cap is the session's when the taskset sets none, so a rollout cut by it ends
            # the session the way envforge's own rollouts end (max_turns, graded and recorded by the service).
            max_turns = data.max_turns if data.max_turns is not None else self.config.agent.max_turns
            session = await client.create_session(
                task_id=data.task_id, content_hash=data.content_hash, max_turns=max_turns
            )
            episode = _Episode(session)
            trace_id = None
            try:
                async with agents.agent.interaction(task) as interaction:
                    trace = interaction.trace
                    trace_id = trace.id
                    _LIVE[trace_id] = episode
                    trace.info[INFO] = {"session_id": session.id, "task_id": data.task_id}
                    segment = await interaction.turn()  # the prompt opens the exchange
                    while not segment.terminated and not session.done:
                        observations = []
                        for body in actions(segment.last_reply):
                            observations.append(await episode.step(**body))
                            if session.done:
                                break
                        if session.done:
                            break
                        segment = await interaction.turn("\n\n".join(observations))
                    # ended by submit / max turns: the terminal step's grade; else grade the workspace as it is
                    result = session.result if session.result is not None else (await session.verify()).result
                    _check_graded(data.task_id, session.id, result)
                    trace.info[INFO].update(
                        {
                            "end_reason": episode.end_reason,
                            "reward": result.reward,
                            "resolved": result.resolved,
                            "reasons": result.reasons,
                        }
                    )
                    trace.record_metric("envforge_resolved", float(result.resolved))
                    trace.record_metric("envforge_turns", float(episode.turn))
            finally:
                _LIVE.pop(trace_id or "", None)
                await _close(session)


__all__ = [
    "EnvforgeData",
    "EnvforgeEnv",
    "EnvforgeEnvConfig",
    "EnvforgeInfraError",
    "EnvforgeTask",
    "EnvforgeTaskset",
    "EnvforgeTasksetConfig",
]
