"""The clients of the environment service, sync (`Client`) and async (`AsyncClient`).

    with Client("http://127.0.0.1:8080", api_key) as client:
        with client.create_session(task_set="main", index=0) as session:
            print(session.observation.text)
            out = session.step(name="run", arguments={"command": "ls"})
            out = session.step(name="submit")
            print(out.result.reward)

Without arguments the URL and key come from ENVFORGE_SERVICE_URL and ENVFORGE_API_KEY. Responses are
the API's pydantic models (`envforge_client.models`); errors are `envforge_client.errors`' types.
Every request is retried by the client's `RetryPolicy` (`RetryPolicy.never()` to turn that off).
"""

from __future__ import annotations

import os
from typing import Any

import httpx

from envforge_client import models as m
from envforge_client.errors import NotFoundError, SessionLost, raise_for, unreachable
from envforge_client.retries import RetryPolicy

URL_VARIABLE, KEY_VARIABLE = "ENVFORGE_SERVICE_URL", "ENVFORGE_API_KEY"
DEFAULT_URL = "http://127.0.0.1:8080"  # envforge's own default for ENVFORGE_SERVICE_URL (a test keeps them equal)
# Repeating these after a connection broke mid-request does no harm; a step or a new session might run twice.
_IDEMPOTENT = frozenset({"GET", "HEAD", "DELETE"})
DEFAULT_RETRIES = RetryPolicy()
# Failures before the request left this process: it cannot have run.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


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


def resolve_target(base_url: str | None, api_key: str | None) -> tuple[str, str]:
    """(URL, key): the arguments where given, else ENVFORGE_SERVICE_URL (default 127.0.0.1:8080) and
    ENVFORGE_API_KEY, which has no default: every route but /healthz needs a key."""
    url = base_url or os.environ.get(URL_VARIABLE) or DEFAULT_URL
    key = api_key if api_key is not None else os.environ.get(KEY_VARIABLE)
    if key is None:
        raise ValueError(f"no API key: pass api_key or set {KEY_VARIABLE}")
    return url.rstrip("/"), key


class _Base:
    def __init__(self, base_url: str | None, api_key: str | None, retries: RetryPolicy):
        self.base_url, key = resolve_target(base_url, api_key)
        self.headers = {"Authorization": f"Bearer {key}"}
        self.retries = retries

    def _send_failed(self, method: str, exc: httpx.TransportError) -> Exception:
        may_have_run = not isinstance(exc, _NOT_SENT) and method not in _IDEMPOTENT
        return unreachable(self.base_url, exc, may_have_run)


class Client(_Base):
    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        retries: RetryPolicy = DEFAULT_RETRIES,
    ):
        super().__init__(base_url, api_key, retries)
        self.http = httpx.Client(base_url=self.base_url, headers=self.headers, timeout=timeout_s)

    def _send(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        try:
            resp = self.http.request(method, path, json=body)
        except httpx.TransportError as exc:
            raise self._send_failed(method, exc) from None
        raise_for(resp)
        answer: dict[str, Any] = resp.json()
        return answer

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        for attempt in self.retries.retrying():
            with attempt:
                return self._send(method, path, body)
        raise AssertionError("unreachable: tenacity re-raises the last error")

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
    ) -> "Session":
        out = m.SessionOut.model_validate(
            self._call("POST", "/sessions", session_body(task_id, task_set, index, content_hash, seed, max_turns))
        )
        return Session(self, out)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Session:
    """One open session; `close()` (or leaving the `with` block) deletes it on the service."""

    def __init__(self, client: Client, info: m.SessionOut):
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

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncClient(_Base):
    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        max_connections: int = 256,
        retries: RetryPolicy = DEFAULT_RETRIES,
    ):
        super().__init__(base_url, api_key, retries)
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self.http = httpx.AsyncClient(base_url=self.base_url, headers=self.headers, timeout=timeout_s, limits=limits)

    async def _send(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        try:
            resp = await self.http.request(method, path, json=body)
        except httpx.TransportError as exc:
            raise self._send_failed(method, exc) from None
        raise_for(resp)
        answer: dict[str, Any] = resp.json()
        return answer

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        async for attempt in self.retries.async_retrying():
            with attempt:
                return await self._send(method, path, body)
        raise AssertionError("unreachable: tenacity re-raises the last error")

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
    ) -> "AsyncSession":
        out = m.SessionOut.model_validate(
            await self._call("POST", "/sessions", session_body(task_id, task_set, index, content_hash, seed, max_turns))
        )
        return AsyncSession(self, out)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class AsyncSession:
    def __init__(self, client: AsyncClient, info: m.SessionOut):
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

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
