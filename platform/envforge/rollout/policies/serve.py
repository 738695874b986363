"""An OpenAI-compatible HTTP server over an `HFPolicy`: the stand-in for `vllm serve`.

It lets a local checkpoint be used exactly like `vllm serve` or a hosted endpoint (through
`OpenAIChatPolicy`, the openai SDK, or an eval harness), so rollout workers in other
processes share one model, and training can hot-swap weights with `POST /v1/reload`
without restarting anything.

Routes: `/v1/chat/completions` and `/v1/completions` (both with `stream`, `n`, `stop`,
`top_p`, `logprobs`; what the server cannot honour is refused with a 400 naming the field,
see `openai_schema`), `/v1/models`, `/v1/reload`, `/health`, `/metrics`. With an API key
every `/v1/` route needs `Authorization: Bearer <key>` (401 otherwise), as with vLLM.
Concurrent requests are sampled together in padded batches (`batcher.Batcher`).

Beyond the OpenAI schema, with `logprobs: true` (or vLLM's `return_token_ids: true`) a
chat response carries `choices[i].token_ids` (completion ids) and top-level
`prompt_token_ids`, the same extension fields vLLM uses, plus `policy_version` (the
checkpoint version that produced the turn). Malformed requests get 400 with an
OpenAI-style JSON error and never take the server down.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import jinja2
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from envforge.observe import metrics as live
from envforge.observe.http import metrics_payload
from envforge.rollout.policies.batcher import Batcher
from envforge.rollout.policies.hf import HFPolicy, parse_tool_calls
from envforge.rollout.policies.openai_schema import (
    BadRequest,
    ChatRequest,
    CompletionRequest,
    parse_chat_request,
    parse_completion_request,
)

__all__ = ["BadRequest", "make_app", "parse_chat_request", "parse_completion_request", "serve"]

TOOL_CALL_OPEN = "<tool_call>"
_MIN_LOGPROB = -9999.0  # what vLLM sends for -inf (JSON has no infinity)
_ARGUMENT_FRAGMENT = 16  # characters of tool-call arguments per streamed delta


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "code": status}})


def _sse(payload: dict[str, Any] | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


def _held_prefix(text: str, marker: str) -> int:
    """How many trailing characters of `text` could be the start of `marker` (and must wait)."""
    for m in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:m]):
            return m
    return 0


class StreamedText:
    """How much of one choice's text is safe to send while it is being generated.

    Held back: an incomplete UTF-8 character, anything that may be the start of a stop
    string, and (when tool calls are parsed) everything from `<tool_call>` on and the
    whitespace before it. The streamed content of a turn with calls keeps any leading
    whitespace, which the non-streamed content (stripped, like the trajectory's) drops."""

    def __init__(self, policy: HFPolicy, stops: tuple[str, ...], stop_ids: set[int], tool_calls: bool) -> None:
        self.policy, self.stops, self.stop_ids, self.tool_calls = policy, stops, stop_ids, tool_calls
        self.tokens: list[int] = []
        self.sent = ""

    def _safe(self, text: str) -> str:
        text = text.rstrip("\ufffd")
        cut = min([k for k in (text.find(s) for s in self.stops) if k >= 0], default=-1)
        if cut >= 0:
            text = text[:cut]
        else:
            text = text[: len(text) - max((_held_prefix(text, s) for s in self.stops), default=0)]
        if self.tool_calls:
            k = text.find(TOOL_CALL_OPEN)
            text = text[:k] if k >= 0 else text[: len(text) - _held_prefix(text, TOOL_CALL_OPEN)]
            text = text.rstrip()
        return text

    def add(self, token: int) -> str:
        """The new text to send after `token`."""
        if token in self.stop_ids:
            return ""
        self.tokens.append(token)
        safe = self._safe(self.policy.tokenizer.decode(self.tokens, skip_special_tokens=True))
        if len(safe) > len(self.sent) and safe.startswith(self.sent):
            delta, self.sent = safe[len(self.sent) :], safe
            return delta
        return ""

    def rest(self, final: str) -> str:
        """What is left to send once the final content is known."""
        return final[len(self.sent) :] if final.startswith(self.sent) else ""


def make_app(
    policy: HFPolicy,
    model_name: str | None = None,
    *,
    api_key: str | None = None,
    max_batch: int = 16,
    batch_wait_s: float = 0.005,
) -> FastAPI:
    """The FastAPI app serving `policy` (`model_name` defaults to its `policy_id`).

    `api_key`: required as a Bearer token on every `/v1/` route. `max_batch`: the most
    sequences sampled together (1: one request at a time); `batch_wait_s`: how long a
    batch waits for more requests once the first is queued."""
    app = FastAPI(title="envforge policy server")
    created = int(time.time())
    batcher = Batcher(policy, max_rows=max_batch, wait_s=batch_wait_s)
    app.state.batcher = batcher

    def name() -> str:
        return model_name or policy.policy_id

    @app.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
        return _error(500, f"{type(exc).__name__}: {exc}", "server_error")

    if api_key:
        expected = f"Bearer {api_key}".encode()

        @app.middleware("http")
        async def _authenticate(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
            given = request.headers.get("authorization", "").encode()
            if request.url.path.startswith("/v1/") and not secrets.compare_digest(given, expected):
                return _error(
                    401, "invalid or missing API key: send Authorization: Bearer <key>", "authentication_error"
                )
            return await call_next(request)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "policy_id": policy.policy_id,
            "version": policy.version,
            "batching": {"max_rows": batcher.max_rows, **{f"seen_{k}": v for k, v in batcher.stats.as_dict().items()}},
        }

    @app.get("/metrics")
    async def metrics() -> Response:
        body, content_type = metrics_payload()
        return Response(body, media_type=content_type)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": name(),
                    "object": "model",
                    "created": created,
                    "owned_by": "envforge",
                    "root": policy.model_path,
                    "policy_version": policy.version,
                }
            ],
        }

    @app.post("/v1/reload")
    async def reload(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the request body must be JSON")
        path = body.get("path") if isinstance(body, dict) else None
        if not isinstance(path, str) or not path:
            return _error(400, 'reload needs {"path": "<checkpoint directory>"}')
        try:
            version = await asyncio.to_thread(policy.reload, path)
        except (OSError, ValueError) as exc:
            return _error(400, f"cannot load {path}: {exc}")
        return JSONResponse({"ok": True, "version": version, "policy_id": policy.policy_id})

    # -- shared pieces ----------------------------------------------------------------------------

    def token_text(tid: int) -> str:
        return policy.tokenizer.decode([tid], skip_special_tokens=False)

    def chat_logprob(tid: int, lp: float, top: list[tuple[int, float]] | None) -> dict[str, Any]:
        def entry(t: int, v: float) -> dict[str, Any]:
            piece = token_text(t)
            return {"token": piece, "logprob": max(v, _MIN_LOGPROB), "bytes": list(piece.encode("utf-8", "replace"))}

        return {**entry(tid, lp), "top_logprobs": [entry(t, v) for t, v in (top or [])]}

    def legacy_logprobs(
        tids: list[int], lps: list[float], tops: list[list[tuple[int, float]]] | None, offset: int = 0
    ) -> dict[str, Any]:
        tokens = [token_text(t) for t in tids]
        offsets = []
        for piece in tokens:
            offsets.append(offset)
            offset += len(piece)
        top = [
            {token_text(t): max(v, _MIN_LOGPROB) for t, v in [*(step or []), (tid, lp)]}
            for tid, lp, step in zip(tids, lps, tops or [None] * len(tids))
        ]
        return {
            "tokens": tokens,
            "token_logprobs": [max(v, _MIN_LOGPROB) for v in lps],
            "top_logprobs": top,
            "text_offset": offsets,
        }

    def stop_ids(req: ChatRequest | CompletionRequest) -> set[int]:
        return policy.stop_ids() | set(req.stop_token_ids or ())

    async def timed(handler: Callable[[Request], Awaitable[Response]], request: Request) -> Response:
        started = time.perf_counter()
        response = await handler(request)
        if not isinstance(response, StreamingResponse):  # a stream records itself when it ends
            live.policy_request(time.perf_counter() - started, response.status_code, getattr(response, "tokens", 0))
        return response

    async def read_body(request: Request, parse: Callable[[Any], Any]) -> Any:
        try:
            body = await request.json()
        except ValueError:
            raise BadRequest("the request body must be JSON") from None
        return parse(body)

    async def stream_events(
        rows: list,
        on_event: Callable[[int, int, float, Any], list[str]],
    ) -> AsyncIterator[tuple[list[str], tuple[list[Any], int] | None]]:
        """Run `rows` in the batcher; yield the SSE lines `on_event` makes per token, then the generations."""
        events: asyncio.Queue = asyncio.Queue()
        task = asyncio.ensure_future(batcher.submit(rows, lambda *e: events.put_nowait(e)))
        try:
            while not (task.done() and events.empty()):
                getter = asyncio.ensure_future(events.get())
                await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield on_event(*getter.result()), None
                else:
                    getter.cancel()
            yield [], task.result()
        finally:
            if not task.done():
                task.cancel()

    # -- chat completions ---------------------------------------------------------------------------

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await timed(_chat, request)

    async def _chat(request: Request) -> Response:
        try:
            req = await read_body(request, parse_chat_request)
            prompt_ids = policy.encode_prompt(req.chat_messages(), req.active_tools)
        except BadRequest as exc:
            return _error(400, str(exc))
        except (ValueError, TypeError, jinja2.TemplateError) as exc:  # template errors on odd messages
            return _error(400, f"cannot render or run this request: {type(exc).__name__}: {exc}")
        rows = req.sampling_rows(prompt_ids)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        if req.stream:
            return StreamingResponse(_chat_stream(req, rid, prompt_ids, rows), media_type="text/event-stream")
        gens, version = await batcher.submit(rows)
        choices = []
        for j, gen in enumerate(gens):
            message, finish = _chat_message(req, gen)
            choice: dict[str, Any] = {"index": j, "message": message, "finish_reason": finish, "logprobs": None}
            if req.logprobs:
                choice["logprobs"] = {
                    "content": [
                        chat_logprob(t, lp, top)
                        for t, lp, top in zip(
                            gen.token_ids, gen.logprobs, gen.top_logprobs or [None] * len(gen.token_ids)
                        )
                    ]
                }
            if req.wants_token_ids:
                choice["token_ids"] = gen.token_ids
            choices.append(choice)
        n_out = sum(len(g.token_ids) for g in gens)
        response: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": name(),
            "choices": choices,
            "policy_version": version,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": n_out,
                "total_tokens": len(prompt_ids) + n_out,
            },
        }
        if req.wants_token_ids:
            response["prompt_token_ids"] = prompt_ids
        reply = JSONResponse(response)
        reply.tokens = n_out  # for the metrics of `timed`
        return reply

    def _chat_message(req: ChatRequest, gen: Any) -> tuple[dict[str, Any], str]:
        text = policy.completion_text(gen)
        content, calls = parse_tool_calls(text) if req.tool_choice != "none" else (text, [])
        message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
        if calls:
            message["tool_calls"] = calls
        return message, "tool_calls" if calls and gen.finish_reason == "stop" else gen.finish_reason

    async def _chat_stream(req: ChatRequest, rid: str, prompt_ids: list[int], rows: list) -> AsyncIterator[str]:
        started = time.perf_counter()
        head = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": name()}
        parse_calls = req.tool_choice != "none"
        texts = [StreamedText(policy, req.stop_strings, stop_ids(req), parse_calls) for _ in rows]

        def chunk(j: int, delta: dict[str, Any], logprobs: Any = None, finish: str | None = None, **extra: Any) -> str:
            return _sse(
                {
                    **head,
                    "choices": [{"index": j, "delta": delta, "logprobs": logprobs, "finish_reason": finish, **extra}],
                }
            )

        def on_token(j: int, tid: int, lp: float, top: Any) -> list[str]:
            delta = texts[j].add(tid)
            logprobs = {"content": [chat_logprob(tid, lp, top)]} if req.logprobs else None
            return [chunk(j, {"content": delta}, logprobs)] if delta or logprobs else []

        status, n_out = 200, 0
        try:
            for j in range(len(rows)):
                yield chunk(j, {"role": "assistant", "content": ""})
            async for lines, result in stream_events(rows, on_token):
                for line in lines:
                    yield line
                if result is None:
                    continue
                gens, version = result
                for j, gen in enumerate(gens):
                    message, finish = _chat_message(req, gen)
                    rest = texts[j].rest(message["content"] or "")
                    if rest:
                        yield chunk(j, {"content": rest})
                    for k, call in enumerate(message.get("tool_calls", [])):
                        fn = call["function"]
                        yield chunk(
                            j,
                            {
                                "tool_calls": [
                                    {
                                        "index": k,
                                        "id": call["id"],
                                        "type": "function",
                                        "function": {"name": fn["name"], "arguments": ""},
                                    }
                                ]
                            },
                        )
                        args = fn["arguments"]
                        for at in range(0, len(args), _ARGUMENT_FRAGMENT):
                            yield chunk(
                                j,
                                {
                                    "tool_calls": [
                                        {"index": k, "function": {"arguments": args[at : at + _ARGUMENT_FRAGMENT]}}
                                    ]
                                },
                            )
                    extra = {"token_ids": gen.token_ids} if req.wants_token_ids else {}
                    yield chunk(j, {}, None, finish, **extra)
                n_out = sum(len(g.token_ids) for g in gens)
                if req.include_usage:
                    yield _sse(
                        {
                            **head,
                            "choices": [],
                            "policy_version": version,
                            "usage": {
                                "prompt_tokens": len(prompt_ids),
                                "completion_tokens": n_out,
                                "total_tokens": len(prompt_ids) + n_out,
                            },
                        }
                    )
        except Exception as exc:  # noqa: BLE001 - the status line is sent; the error goes in the stream, as vLLM does
            status = 500
            yield _sse({"error": {"message": f"{type(exc).__name__}: {exc}", "type": "server_error", "code": 500}})
        yield _sse("[DONE]")
        live.policy_request(time.perf_counter() - started, status, n_out)

    # -- completions --------------------------------------------------------------------------------

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await timed(_completions, request)

    def completion_prompt_ids(prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = list(policy.tokenizer.encode(prompt))
        else:
            vocab = len(policy.tokenizer)
            bad = [t for t in prompt if not 0 <= t < vocab]
            if bad:
                raise BadRequest(f"prompt: token ids {bad[:5]} are outside the vocabulary (0..{vocab - 1})")
            ids = list(prompt)
        if not ids:
            raise BadRequest("prompt: empty (no tokens to continue)")
        return ids

    async def _completions(request: Request) -> Response:
        try:
            req = await read_body(request, parse_completion_request)
            prompts = [completion_prompt_ids(p) for p in req.prompts]
        except BadRequest as exc:
            return _error(400, str(exc))
        rows = [row for ids in prompts for row in req.sampling_rows(ids)]
        rid = f"cmpl-{uuid.uuid4().hex}"
        if req.stream:
            return StreamingResponse(_completion_stream(req, rid, prompts, rows), media_type="text/event-stream")
        gens, version = await batcher.submit(rows)
        choices = []
        for j, gen in enumerate(gens):
            choice: dict[str, Any] = {
                "index": j,
                "text": policy.completion_text(gen),
                "logprobs": None,
                "finish_reason": gen.finish_reason,
            }
            if req.logprobs is not None:
                choice["logprobs"] = legacy_logprobs(gen.token_ids, gen.logprobs, gen.top_logprobs)
            if req.wants_token_ids:
                choice["token_ids"], choice["prompt_token_ids"] = gen.token_ids, gen.prompt_ids
            choices.append(choice)
        n_in, n_out = sum(len(p) for p in prompts), sum(len(g.token_ids) for g in gens)
        reply = JSONResponse(
            {
                "id": rid,
                "object": "text_completion",
                "created": int(time.time()),
                "model": name(),
                "choices": choices,
                "policy_version": version,
                "usage": {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out},
            }
        )
        reply.tokens = n_out
        return reply

    async def _completion_stream(
        req: CompletionRequest, rid: str, prompts: list[list[int]], rows: list
    ) -> AsyncIterator[str]:
        started = time.perf_counter()
        head = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": name()}
        texts = [StreamedText(policy, req.stop_strings, stop_ids(req), False) for _ in rows]
        offsets = [0] * len(rows)

        def chunk(j: int, text: str, logprobs: Any = None, finish: str | None = None) -> str:
            return _sse(
                {**head, "choices": [{"index": j, "text": text, "logprobs": logprobs, "finish_reason": finish}]}
            )

        def on_token(j: int, tid: int, lp: float, top: Any) -> list[str]:
            delta = texts[j].add(tid)
            logprobs = None
            if req.logprobs is not None:
                logprobs = legacy_logprobs([tid], [lp], [top] if top is not None else None, offsets[j])
                offsets[j] += len(logprobs["tokens"][0])
            return [chunk(j, delta, logprobs)] if delta or logprobs else []

        status, n_out = 200, 0
        try:
            async for lines, result in stream_events(rows, on_token):
                for line in lines:
                    yield line
                if result is None:
                    continue
                gens, version = result
                for j, gen in enumerate(gens):
                    rest = texts[j].rest(policy.completion_text(gen))
                    yield chunk(j, rest, None, gen.finish_reason)
                n_out = sum(len(g.token_ids) for g in gens)
                if req.include_usage:
                    n_in = sum(len(p) for p in prompts)
                    yield _sse(
                        {
                            **head,
                            "choices": [],
                            "policy_version": version,
                            "usage": {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out},
                        }
                    )
        except Exception as exc:  # noqa: BLE001 - see _chat_stream
            status = 500
            yield _sse({"error": {"message": f"{type(exc).__name__}: {exc}", "type": "server_error", "code": 500}})
        yield _sse("[DONE]")
        live.policy_request(time.perf_counter() - started, status, n_out)

    return app


def serve(
    model_path: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    device: str = "cpu",
    dtype: str | None = None,
    model_name: str | None = None,
    threads: int = 0,
    api_key: str | None = None,
    max_batch: int = 16,
) -> None:
    """Load a local checkpoint and serve it until interrupted (blocking); its /metrics is registered
    for Prometheus' file_sd while it serves (port 0: a free port). `threads` > 0 sets the
    process's torch intra-op threads: a server beside a trainer on the same CPUs gets its own
    budget instead of both oversubscribing every core (torch's budget is per process)."""
    import torch
    import uvicorn

    from envforge.observe.http import free_port, registered_target

    if threads > 0:
        torch.set_num_threads(threads)

    policy = HFPolicy(model_path, device=device, dtype=dtype)
    port = port or free_port(host)
    with registered_target("policy_server", host, port):
        uvicorn.run(
            make_app(policy, model_name, api_key=api_key, max_batch=max_batch), host=host, port=port, log_level="info"
        )


if __name__ == "__main__":  # python -m envforge.rollout.policies.serve /ckpt --port 8000
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_path")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--model-name", default=None)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--api-key", default=None, help="require Authorization: Bearer <key> on /v1/ routes")
    parser.add_argument("--max-batch", type=int, default=16, help="most sequences sampled together (1: no batching)")
    a = parser.parse_args()
    serve(
        a.model_path,
        a.host,
        a.port,
        device=a.device,
        dtype=a.dtype,
        model_name=a.model_name,
        threads=a.threads,
        api_key=a.api_key,
        max_batch=a.max_batch,
    )
