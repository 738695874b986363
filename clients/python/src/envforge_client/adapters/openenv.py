"""OpenEnv (openenv-core 0.3) clients for envforge environments, on the service's `/openenv` surface.

- `EnvforgeEnv`: an `EnvClient` with typed actions and observations over `/openenv/ws`. OpenEnv 0.3
  clients are async; `.sync()` gives the synchronous wrapper.

      with EnvforgeEnv("http://127.0.0.1:8080", api_key).sync() as env:
          result = env.reset(task_set="main", index=0)
          result = env.step(EnvforgeAction(name="run", arguments={"command": "ls"}))
          result = env.step(EnvforgeAction(name="submit"))
          print(result.reward, result.observation.result["reasons"])

- `EnvforgeMCPClient`: OpenEnv's `MCPToolClient` over HTTP MCP (`/openenv/mcp`): `list_tools()`,
  `call_tool(name, **arguments)`, one envforge session per client (the task given at construction).
- `EnvforgeSessionFactory`: a `ResourceSessionFactory` for `openenv.core.harness` (its
  `MCPHarnessAdapter` and `build_harness_rollout_func`, a TRL-compatible `rollout_func`).

openenv-core's stock `GenericEnvClient` and `MCPToolClient` work too over WebSocket, with
`api_key` in the reset data (they send no headers).
"""

from __future__ import annotations

from typing import Any, Optional

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.mcp_types import Tool
from openenv.core.harness import (
    ResourceSession,
    ResourceSessionFactory,
    StepEnvSessionAdapter,
    ToolResult,
    VerifyResult,
)
from openenv.core.mcp_client import MCPToolClient
from pydantic import BaseModel, Field
from websockets.asyncio.client import connect as ws_connect

from envforge_client.prompts import SYSTEM_PROMPT, TOOLS

PATH = "/openenv/ws"  # the service's OpenEnv WebSocket route (envforge.service.openenv_ws; a test keeps them equal)
PREFIX = PATH[: -len("/ws")]  # OpenEnv clients append /ws and /mcp to their base URL


class EnvforgeAction(BaseModel):
    """One tool call (name + arguments), or a model's raw reply holding a `<tool_call>` block."""

    name: Optional[str] = None
    arguments: dict[str, Any] = Field(default_factory=dict)
    text: Optional[str] = None


class EnvforgeObservation(BaseModel):
    text: str
    exit_code: Optional[int] = None
    error: Optional[str] = None
    session_id: str = ""
    turn: int = 0
    end_reason: Optional[str] = None
    result: Optional[dict[str, Any]] = None  # the verification result, on the terminal step
    system_prompt: Optional[str] = None  # on reset
    tools: Optional[list[dict[str, Any]]] = None  # on reset
    task_id: Optional[str] = None
    content_hash: Optional[str] = None
    episode_id: Optional[str] = None  # on reset, when the reset named one


def _auth(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"}


class EnvforgeEnv(EnvClient[EnvforgeAction, EnvforgeObservation, dict]):
    def __init__(self, base_url: str, api_key: str, **kwargs: Any):
        super().__init__(base_url.rstrip("/") + PREFIX, **kwargs)
        self._api_key = api_key

    async def connect(self) -> "EnvforgeEnv":
        """As EnvClient.connect, with the API key in the handshake (the base class sends no headers)."""
        if self._ws is None:
            try:
                self._ws = await ws_connect(
                    self._ws_url,
                    open_timeout=self._connect_timeout,
                    max_size=self._max_message_size,
                    additional_headers=_auth(self._api_key),
                )
            except Exception as exc:
                raise ConnectionError(f"Failed to connect to {self._ws_url}: {exc}") from exc
        return self

    def _step_payload(self, action: EnvforgeAction) -> dict[str, Any]:
        if action.text is not None:
            return {"text": action.text}
        return {"name": action.name, "arguments": action.arguments}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[EnvforgeObservation]:
        obs = payload.get("observation", {})
        known = EnvforgeObservation.model_fields
        return StepResult(
            observation=EnvforgeObservation(**{k: v for k, v in obs.items() if k in known}),
            reward=payload.get("reward"),
            done=bool(payload.get("done", False)),
        )

    def _parse_state(self, payload: dict[str, Any]) -> dict:
        return payload


class EnvforgeMCPClient(MCPToolClient):
    """`MCPToolClient` in OpenEnv's production mode (HTTP MCP): the key goes in every request's
    headers, and `openenv/session/create` carries the task (`task`: CreateSession's fields, e.g.
    `{"task_set": "main", "index": 0}`), so `call_tool` plays one envforge session; `close()` ends it."""

    def __init__(self, base_url: str, api_key: str, task: dict[str, Any], **kwargs: Any):
        super().__init__(base_url.rstrip("/") + PREFIX, **kwargs)
        self.use_production_mode = True
        self._api_key, self._task = api_key, dict(task)

    async def _get_http_client(self) -> Any:
        if self._http_client is None:
            import httpx

            self._http_client = httpx.AsyncClient(headers=_auth(self._api_key))
        return self._http_client

    async def _production_mcp_request(self, method: str, params: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        if method == "openenv/session/create":
            params = {**self._task, **(params or {})}
        return await super()._production_mcp_request(method, params)


def mcp_tools() -> list[Tool]:
    """envforge's tools as OpenEnv `Tool`s (MCP's name, description, input schema)."""
    return [
        Tool(
            name=t["function"]["name"],
            description=t["function"]["description"],
            input_schema=t["function"]["parameters"],
        )
        for t in TOOLS
    ]


class EnvforgeSessionFactory(ResourceSessionFactory):
    """One envforge session per rollout for `openenv.core.harness`: `create(task)` resets an
    `EnvforgeEnv` on `task` (CreateSession's fields: `{"task_id": ...}` or `{"task_set", "index"}`;
    a string is a task id); the harness's tool calls are steps, and the reward is the verifier's.

    A harness may stop before the episode ends (a reply with no tool call, its turn limit): then
    `verify` submits, so the reward is still the verifier's on the episode as the model left it."""

    def __init__(self, base_url: str, api_key: str, max_turns: int | None = None):
        self.base_url, self.api_key, self.max_turns = base_url, api_key, max_turns

    def create(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> ResourceSession:
        reset = dict(task) if isinstance(task, dict) else {"task_id": str(task)}
        if self.max_turns is not None:
            reset.setdefault("max_turns", self.max_turns)
        holder: dict[str, Any] = {}

        def verify(transcript: list, final_state: Any, last: StepResult | None, state: Any) -> VerifyResult:
            if last is None or not last.done:  # the harness stopped first: submit, as the model left it
                holder["session"].call_tool("submit", {})
                last = holder["last"]
            obs = last.observation
            return VerifyResult(
                env_reward=last.reward,
                done=last.done,
                metrics={"turns": obs.turn, "end_reason": obs.end_reason},
                artifacts={"verification": obs.result, "session_id": holder.get("session_id")},
            )

        def initial_messages(result: StepResult, _task: Any) -> list[dict[str, Any]]:
            holder["session_id"] = result.observation.session_id
            return [
                {"role": "system", "content": result.observation.system_prompt or SYSTEM_PROMPT},
                {"role": "user", "content": result.observation.text},
            ]

        def tool_result(name: str, arguments: dict[str, Any], result: StepResult, state: Any) -> ToolResult:
            holder["last"] = result
            obs = result.observation
            return ToolResult(  # the model reads the tool's output, as in envforge's own rollouts
                data=obs.text,
                done=result.done,
                metadata={"reward": result.reward, "turn": obs.turn},
                error=obs.error,
            )

        holder["session"] = StepEnvSessionAdapter(
            EnvforgeEnv(self.base_url, self.api_key),
            task=task,
            seed=seed,
            episode_id=episode_id,
            tool_specs=mcp_tools(),
            action_builder=lambda name, arguments: EnvforgeAction(name=name, arguments=arguments),
            initial_messages_builder=initial_messages,
            tool_result_builder=tool_result,
            verify_builder=verify,
            reset_kwargs=reset,
        )
        return holder["session"]
