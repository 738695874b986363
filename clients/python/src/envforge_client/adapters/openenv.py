"""OpenEnv's client for envforge environments: `EnvforgeEnv` is an `openenv-core` `EnvClient` with
typed actions and observations, talking to the service's `/openenv/ws` endpoint.

    with EnvforgeEnv("http://127.0.0.1:8080", api_key) as env:
        result = env.reset(task_set="main", index=0)
        result = env.step(EnvforgeAction(name="run", arguments={"command": "ls"}))
        result = env.step(EnvforgeAction(name="submit"))
        print(result.reward, result.observation.result["reasons"])

`openenv-core`'s `GenericEnvClient` works too, with plain dicts and `api_key` in the reset data.
"""

from __future__ import annotations

from typing import Any, Optional

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from pydantic import BaseModel, Field
from websockets.sync.client import connect as ws_connect

PATH = "/openenv/ws"  # the service's OpenEnv WebSocket route (envforge.service.openenv_ws; a test keeps them equal)


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


class EnvforgeEnv(EnvClient[EnvforgeAction, EnvforgeObservation, dict]):
    def __init__(self, base_url: str, api_key: str, **kwargs: Any):
        # EnvClient appends "/ws" to the base URL: point it at the service's OpenEnv endpoint.
        super().__init__(base_url.rstrip("/") + PATH[: -len("/ws")], **kwargs)
        self._api_key = api_key

    def connect(self) -> "EnvforgeEnv":
        """As EnvClient.connect, with the API key in the handshake (the base class sends no headers)."""
        if self._ws is None:
            try:
                self._ws = ws_connect(
                    self._ws_url,
                    open_timeout=self._connect_timeout,
                    additional_headers={"Authorization": f"Bearer {self._api_key}"},
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
