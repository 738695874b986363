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
from collections.abc import Iterator
from typing import Any

import verifiers.v1 as vf

from envforge_client.client import AsyncClient, AsyncSession, Client
from envforge_client.models import VerifyResult
from envforge_client.prompts import system_message, tool_call_blocks, user_message

REWARD = "envforge_reward"  # the trace's reward name (the task's one @vf.reward)
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
    """Session turn cap (None = each task's own)."""


class EnvforgeData(vf.TaskData):
    url: str
    task_id: str
    content_hash: str
    task_set_version: str
    max_turns: int | None = None


class EnvforgeTask(vf.Task[EnvforgeData]):
    @property
    def key(self) -> str:
        """The task's content hash: the exact task version, stable across runs and task-set versions."""
        return self.data.content_hash

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


def actions(segment: Any) -> list[dict[str, Any]]:
    """The step bodies of one agent segment's reply, in order: its native tool calls, else each
    `<tool_call>` block of its text, else the text itself (the service answers it with an error
    observation naming the missing tool call)."""
    reply = next((m for m in reversed(segment.messages) if isinstance(m, vf.AssistantMessage)), None)
    if reply is not None and reply.tool_calls:
        return [
            {"tool_call": {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}}
            for c in reply.tool_calls
        ]
    text = segment.last_reply
    return [{"text": block} for block in tool_call_blocks(text)] or [{"text": text}]


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
    cancellation of the caller does not stop."""
    await asyncio.shield(asyncio.ensure_future(session.close()))


class EnvforgeEnv(vf.Env[EnvforgeEnvConfig]):
    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        data = task.data
        assert isinstance(data, EnvforgeData), f"EnvforgeEnv runs envforge tasks, got {type(data).__name__}"
        async with AsyncClient(data.url) as client:
            session = await client.create_session(
                task_id=data.task_id, content_hash=data.content_hash, max_turns=data.max_turns
            )
            try:
                async with agents.agent.interaction(task) as interaction:
                    trace = interaction.trace
                    trace.info[INFO] = {"session_id": session.id, "task_id": data.task_id}
                    segment = await interaction.turn()  # the prompt opens the exchange
                    turns = 0
                    while not segment.terminated and not session.done:
                        observations = []
                        for body in actions(segment):
                            out = await session.step(**body)
                            turns = out.turn
                            observations.append(observation_text(out.observation))
                            if out.done:
                                trace.info[INFO]["end_reason"] = out.end_reason
                                break
                        if session.done:
                            break
                        segment = await interaction.turn("\n\n".join(observations))
                    # ended by submit / max turns: the terminal step's grade; else grade the workspace as it is
                    result = session.result if session.result is not None else (await session.verify()).result
                    _check_graded(data.task_id, session.id, result)
                    trace.info[INFO].update(
                        {"reward": result.reward, "resolved": result.resolved, "reasons": result.reasons}
                    )
                    trace.record_metric("envforge_resolved", float(result.resolved))
                    trace.record_metric("envforge_turns", float(turns))
            finally:
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
