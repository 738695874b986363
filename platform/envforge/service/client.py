"""The Python client of the environment service, sync (`EnvforgeClient`) and async
(`AsyncEnvforgeClient`), with one error type per thing a caller handles differently.

    with EnvforgeClient("http://127.0.0.1:8080", api_key) as client:
        with client.create_session(task_set="main", index=0) as session:
            print(session.observation.text)
            out = session.step(name="run", arguments={"command": "ls"})
            out = session.step(name="submit")
            print(out.result.reward)

Responses are the API's pydantic models (`envforge.service.models`).
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from envforge.service import models as m


class ServiceError(Exception):
    """Any error answer from the service: `status`, `code` and the service's message."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{message} (HTTP {status}, {code})")
        self.status, self.code, self.message = status, code, message


class AuthenticationError(ServiceError):
    """401: the key is missing, unknown or revoked."""


class NotFoundError(ServiceError):
    """404: no such task set, task or session for this key."""


class SessionLost(ServiceError):
    """The session is gone (the service restarted, it idled out, or an infrastructure fault took its
    sandbox). Not a model failure: start a new session and redo the episode."""


class QuotaExceededError(ServiceError):
    """429: wait `retry_after_s` seconds."""

    def __init__(self, status: int, code: str, message: str, retry_after_s: float):
        super().__init__(status, code, message)
        self.retry_after_s = retry_after_s


class RequestTooLarge(ServiceError):
    """413: the request body is over the service's cap."""


class ServiceUnavailable(ServiceError):
    """503 (the service is full) or the service cannot be reached: retry later."""


def _raise_for(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        body = resp.json()
    except ValueError:
        body = {}
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        code, message = str(err.get("code", "")), str(err.get("message", ""))
    else:
        code, message = "invalid_request", json.dumps(body.get("detail", body) if isinstance(body, dict) else body)
    status = resp.status_code
    if status == 401:
        raise AuthenticationError(status, code, message)
    if status == 404:
        raise NotFoundError(status, code, message)
    if status == 410 or code == "infra_error":
        raise SessionLost(status, code, message)
    if status == 429:
        raise QuotaExceededError(status, code, message, float(resp.headers.get("retry-after", "1")))
    if status == 413:
        raise RequestTooLarge(status, code, message)
    if status == 503:
        raise ServiceUnavailable(status, code, message)
    raise ServiceError(status, code, message)


def step_body(
    tool_call: dict[str, Any] | None = None,
    text: str | None = None,
    name: str | None = None,
    arguments: dict[str, Any] | str | None = None,
) -> dict[str, Any]:
    """The body of POST /sessions/{id}/step from a tool call, a text reply, or a tool name + arguments."""
    if name is not None:
        tool_call = {"type": "function", "function": {"name": name, "arguments": arguments or {}}}
    if (tool_call is None) == (text is None):
        raise ValueError("give exactly one of tool_call, text, or name (+ arguments)")
    return {"tool_call": tool_call} if tool_call is not None else {"text": text}


def session_body(
    task_id: str | None,
    task_set: str | None,
    index: int | None,
    content_hash: str | None,
    seed: int,
    max_turns: int | None,
) -> dict[str, Any]:
    body = {
        "task_id": task_id,
        "task_set": task_set,
        "index": index,
        "content_hash": content_hash,
        "seed": seed,
        "max_turns": max_turns,
    }
    return {k: v for k, v in body.items() if v is not None}


def _unreachable(base_url: str, exc: Exception) -> ServiceUnavailable:
    return ServiceUnavailable(0, "unreachable", f"cannot reach the envforge service at {base_url}: {exc}")


class _Base:
    def __init__(self, base_url: str, api_key: str):
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"}


class EnvforgeClient(_Base):
    def __init__(self, base_url: str, api_key: str, timeout_s: float = 600.0):
        super().__init__(base_url, api_key)
        self.http = httpx.Client(base_url=self.base_url, headers=self.headers, timeout=timeout_s)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            resp = self.http.request(method, path, json=body)
        except httpx.TransportError as exc:
            raise _unreachable(self.base_url, exc) from None
        _raise_for(resp)
        return resp.json()

    def health(self) -> m.Health:
        return m.Health.model_validate(self._call("GET", "/healthz"))

    def task_sets(self) -> list[m.TaskSetOut]:
        return m.TaskSetList.model_validate(self._call("GET", "/task-sets")).task_sets

    def tasks(self, task_set: str) -> m.TaskList:
        return m.TaskList.model_validate(self._call("GET", f"/task-sets/{task_set}/tasks"))

    def create_session(
        self,
        task_id: str | None = None,
        task_set: str | None = None,
        index: int | None = None,
        content_hash: str | None = None,
        seed: int = 0,
        max_turns: int | None = None,
    ) -> "EnvSession":
        out = m.SessionOut.model_validate(
            self._call("POST", "/sessions", session_body(task_id, task_set, index, content_hash, seed, max_turns))
        )
        return EnvSession(self, out)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "EnvforgeClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class EnvSession:
    """One open session; `close()` (or leaving the `with` block) deletes it on the service."""

    def __init__(self, client: EnvforgeClient, info: m.SessionOut):
        self.client, self.info = client, info
        self.id, self.observation = info.session_id, info.observation
        self.done = info.done
        self.result: m.VerifyResult | None = None

    def step(
        self,
        tool_call: dict[str, Any] | None = None,
        text: str | None = None,
        name: str | None = None,
        arguments: dict[str, Any] | str | None = None,
    ) -> m.StepOut:
        out = m.StepOut.model_validate(
            self.client._call("POST", f"/sessions/{self.id}/step", step_body(tool_call, text, name, arguments))
        )
        self.observation, self.done = out.observation, out.done
        if out.result is not None:
            self.result = out.result
        return out

    def verify(self) -> m.VerifyOut:
        out = m.VerifyOut.model_validate(self.client._call("POST", f"/sessions/{self.id}/verify"))
        if out.done:
            self.result = out.result
        return out

    def state(self) -> m.SessionState:
        return m.SessionState.model_validate(self.client._call("GET", f"/sessions/{self.id}"))

    def close(self) -> m.SessionClosed | None:
        try:
            return m.SessionClosed.model_validate(self.client._call("DELETE", f"/sessions/{self.id}"))
        except (NotFoundError, SessionLost):
            return None  # already gone: nothing left to release

    def __enter__(self) -> "EnvSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncEnvforgeClient(_Base):
    def __init__(self, base_url: str, api_key: str, timeout_s: float = 600.0, max_connections: int = 256):
        super().__init__(base_url, api_key)
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self.http = httpx.AsyncClient(base_url=self.base_url, headers=self.headers, timeout=timeout_s, limits=limits)

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            resp = await self.http.request(method, path, json=body)
        except httpx.TransportError as exc:
            raise _unreachable(self.base_url, exc) from None
        _raise_for(resp)
        return resp.json()

    async def health(self) -> m.Health:
        return m.Health.model_validate(await self._call("GET", "/healthz"))

    async def task_sets(self) -> list[m.TaskSetOut]:
        return m.TaskSetList.model_validate(await self._call("GET", "/task-sets")).task_sets

    async def tasks(self, task_set: str) -> m.TaskList:
        return m.TaskList.model_validate(await self._call("GET", f"/task-sets/{task_set}/tasks"))

    async def create_session(
        self,
        task_id: str | None = None,
        task_set: str | None = None,
        index: int | None = None,
        content_hash: str | None = None,
        seed: int = 0,
        max_turns: int | None = None,
    ) -> "AsyncEnvSession":
        out = m.SessionOut.model_validate(
            await self._call("POST", "/sessions", session_body(task_id, task_set, index, content_hash, seed, max_turns))
        )
        return AsyncEnvSession(self, out)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> "AsyncEnvforgeClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class AsyncEnvSession:
    def __init__(self, client: AsyncEnvforgeClient, info: m.SessionOut):
        self.client, self.info = client, info
        self.id, self.observation = info.session_id, info.observation
        self.done = info.done
        self.result: m.VerifyResult | None = None

    async def step(
        self,
        tool_call: dict[str, Any] | None = None,
        text: str | None = None,
        name: str | None = None,
        arguments: dict[str, Any] | str | None = None,
    ) -> m.StepOut:
        out = m.StepOut.model_validate(
            await self.client._call("POST", f"/sessions/{self.id}/step", step_body(tool_call, text, name, arguments))
        )
        self.observation, self.done = out.observation, out.done
        if out.result is not None:
            self.result = out.result
        return out

    async def verify(self) -> m.VerifyOut:
        out = m.VerifyOut.model_validate(await self.client._call("POST", f"/sessions/{self.id}/verify"))
        if out.done:
            self.result = out.result
        return out

    async def state(self) -> m.SessionState:
        return m.SessionState.model_validate(await self.client._call("GET", f"/sessions/{self.id}"))

    async def close(self) -> m.SessionClosed | None:
        try:
            return m.SessionClosed.model_validate(await self.client._call("DELETE", f"/sessions/{self.id}"))
        except (NotFoundError, SessionLost):
            return None

    async def __aenter__(self) -> "AsyncEnvSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
