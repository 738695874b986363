"""A policy behind an OpenAI-compatible chat-completions endpoint.

This is how `vllm serve`, SGLang, `envforge.rollout.policies.serve` and hosted endpoints are
used. Transport faults (connection errors, timeouts, 5xx, 429) are retried with exponential
backoff, because at rollout scale a restarting server or a full queue is routine; any other
4xx means the request itself is wrong and retrying cannot help, so it raises at once. Both
end as `PolicyError`, which the scheduler treats as an infrastructure fault.

Token ids and log-probs are filled when the server returns them: `logprobs.content[].logprob`
(OpenAI, vLLM), `choices[0].token_ids` and top-level `prompt_token_ids` (vLLM with
`return_token_ids`, and our own server).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import aiohttp

from envforge.rollout.policies.base import PolicyError, PolicyOutput

_RETRY_AFTER_CAP_S = 30.0


class _Retryable(Exception):
    """A failure worth another attempt (kept internal; the caller sees PolicyError)."""

    def __init__(self, message: str, retry_after: str | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _error_message(status: int, raw: str) -> str:
    try:
        body = json.loads(raw)
    except ValueError:
        return raw.strip()[:2000] or f"HTTP {status}"
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body.get("message")))
        if isinstance(err, dict):
            err = err.get("message", err)
        if err is not None:
            return str(err)[:2000]
    return raw.strip()[:2000]


def _finish_reason(value: Any) -> str:
    """OpenAI reports "tool_calls" when a turn ends in calls; for the trajectory it is a normal stop."""
    if value in (None, "tool_calls", "function_call", "eos", "stop_sequence"):
        return "stop"
    return str(value)


def _tool_calls(raw: Any) -> list[dict[str, Any]]:
    calls = []
    for n, call in enumerate(raw or []):
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            continue
        fn = call["function"]
        args = fn.get("arguments", "{}")
        calls.append(
            {
                "id": call.get("id") or f"call_{n}",
                "type": call.get("type", "function"),
                "function": {"name": fn.get("name"), "arguments": args if isinstance(args, str) else json.dumps(args)},
            }
        )
    return calls


def parse_chat_response(body: dict[str, Any], latency_s: float = 0.0) -> PolicyOutput:
    """A `PolicyOutput` from a chat-completions response body (raises PolicyError if unusable)."""
    try:
        choice = body["choices"][0]
        message = choice.get("message") or {}
    except (KeyError, IndexError, TypeError, AttributeError):
        raise PolicyError(f"response has no choices: {str(body)[:500]}") from None
    content = message.get("content")
    if isinstance(content, list):  # content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    logprobs = None
    lp = choice.get("logprobs")
    if isinstance(lp, dict) and isinstance(lp.get("content"), list):
        logprobs = [float(e["logprob"]) for e in lp["content"] if isinstance(e, dict) and "logprob" in e]
    token_ids = choice.get("token_ids")
    prompt_ids = body.get("prompt_token_ids", choice.get("prompt_token_ids"))
    return PolicyOutput(
        text=content or "",
        tool_calls=_tool_calls(message.get("tool_calls")),
        prompt_token_ids=list(prompt_ids) if isinstance(prompt_ids, list) else None,
        token_ids=list(token_ids) if isinstance(token_ids, list) else None,
        logprobs=logprobs,
        finish_reason=_finish_reason(choice.get("finish_reason")),
        latency_s=latency_s,
    )


class OpenAIChatPolicy:
    """A `Policy` that calls `POST {base_url}/chat/completions` (base_url ends in `/v1`).

    `extra_body` is merged into every request, for server extensions such as vLLM's
    `{"return_token_ids": true}` or `top_k`; hosted OpenAI rejects unknown fields, so none
    are sent by default. `server_version` holds the `policy_version` our own server reports."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 120,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        policy_id: str | None = None,
        version: int = 0,
        *,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.policy_id = policy_id or f"openai:{self.base_url}:{model}"
        self.version = version
        self.extra_body = dict(extra_body or {})
        self.server_version: int | None = None
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        """One session per event loop: a session cannot outlive (or cross) the loop it was made on."""
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            headers = {"Content-Type": "application/json"}
            if self.api_key:
                headers["Authorization"] = f"Bearer {self.api_key}"
            self._session = aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=self.timeout_s))
            self._session_loop = loop
        return self._session

    def _payload(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        seed: int,
        temperature: float,
        max_tokens: int,
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "seed": seed,
            "temperature": temperature,
            "max_tokens": max_tokens,
            "logprobs": True,
        }
        if tools:
            payload["tools"] = tools
        payload.update(self.extra_body)
        return payload

    async def _post_once(self, url: str, payload: dict[str, Any]) -> dict[str, Any]:
        session = self._get_session()
        try:
            async with session.post(url, json=payload) as resp:
                raw = await resp.text()
                if resp.status == 429 or resp.status >= 500:
                    raise _Retryable(
                        f"HTTP {resp.status} from {url}: {_error_message(resp.status, raw)}",
                        resp.headers.get("Retry-After"),
                    )
                if resp.status >= 400:
                    raise PolicyError(f"HTTP {resp.status} from {url}: {_error_message(resp.status, raw)}")
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError) as exc:
            raise _Retryable(f"{type(exc).__name__} calling {url}: {exc}") from exc
        try:
            body = json.loads(raw)
        except ValueError:
            raise _Retryable(f"non-JSON response from {url}: {raw[:200]!r}") from None
        if not isinstance(body, dict):
            raise PolicyError(f"unexpected response from {url}: {raw[:200]!r}")
        return body

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        delay = self.backoff_s * (2**attempt)
        if retry_after:
            try:
                delay = max(delay, min(float(retry_after), _RETRY_AFTER_CAP_S))
            except ValueError:
                pass
        return delay * (1 + 0.1 * random.random())  # jitter, so many workers do not retry in lockstep

    async def request(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST `payload` to `{base_url}{path}` with the retry policy above; the JSON body.

        The embeddings and judge calls of decontamination go through here too, so every
        OpenAI-compatible call envforge makes retries and fails the same way."""
        url = f"{self.base_url}{path}"
        last: _Retryable | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                await asyncio.sleep(self._delay(attempt - 1, last.retry_after if last else None))
            try:
                return await self._post_once(url, payload)
            except _Retryable as exc:
                last = exc
        raise PolicyError(f"gave up after {self.max_retries + 1} attempts: {last}")

    async def act(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        seed: int,
        temperature: float = 1.0,
        max_tokens: int = 512,
    ) -> PolicyOutput:
        payload = self._payload(messages, tools, seed, temperature, max_tokens)
        start = time.perf_counter()
        body = await self.request("/chat/completions", payload)
        out = parse_chat_response(body, latency_s=time.perf_counter() - start)
        if isinstance(body.get("policy_version"), int):
            self.server_version = body["policy_version"]
        return out

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None
        self._session_loop = None
