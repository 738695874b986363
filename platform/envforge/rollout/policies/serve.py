"""An OpenAI-compatible HTTP server over an `HFPolicy`.

It lets a local checkpoint be used exactly like `vllm serve` or a hosted endpoint (through
`OpenAIChatPolicy`), so rollout workers in other processes share one model, and training can
hot-swap weights with `POST /v1/reload` without restarting anything.

Beyond the OpenAI schema, with `logprobs: true` (or vLLM's `return_token_ids: true`) a
response carries `choices[0].token_ids` (completion ids) and top-level `prompt_token_ids`,
the same extension fields vLLM uses, plus `policy_version` (the checkpoint version that
produced the turn). Generations are serialized by the policy's lock; malformed requests get
400 with an OpenAI-style JSON error and never take the server down.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from typing import Any, Literal

import jinja2
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, ValidationError, field_validator

from envforge.observe import metrics as live
from envforge.observe.http import metrics_payload
from envforge.rollout.policies.hf import HFPolicy

class BadRequest(ValueError):
    """A request the server will not run; the message goes back to the client with a 400."""


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "code": status}})


_OPEN = ConfigDict(extra="allow")  # OpenAI clients send more than we read (model, name, tool_call_id, ...)


class ToolCall(BaseModel):
    model_config = _OPEN
    function: dict[str, Any]


class ChatMessage(BaseModel):
    model_config = _OPEN
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list | None = None
    tool_calls: list[ToolCall] | None = None


class ChatRequest(BaseModel):
    """A chat-completions body, validated: what the server runs (`HFPolicy.act` arguments plus flags)."""

    model_config = _OPEN
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    temperature: StrictFloat | StrictInt | None = Field(default=None, ge=0.0, le=100.0)
    max_tokens: StrictInt | None = Field(default=None, ge=1, le=1 << 20)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1, le=1 << 20)
    seed: StrictInt | None = Field(default=None, ge=-(1 << 63), le=(1 << 64) - 1)
    n: StrictInt | None = None
    stream: bool | None = None
    logprobs: StrictBool = False
    return_token_ids: bool | None = None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int | None) -> int | None:
        if n not in (None, 1):
            raise ValueError("n must be 1")
        return n

    @field_validator("stream")
    @classmethod
    def _no_stream(cls, stream: bool | None) -> bool | None:
        if stream:
            raise ValueError("stream is not supported")
        return stream

    def chat_messages(self) -> list[dict[str, Any]]:
        """The messages as the client sent them (`developer` read as `system`)."""
        out = [m.model_dump(exclude_unset=True) for m in self.messages]
        return [{**m, "role": "system"} if m["role"] == "developer" else m for m in out]

    @property
    def sampling_temperature(self) -> float:
        return 1.0 if self.temperature is None else float(self.temperature)

    @property
    def completion_tokens(self) -> int:
        return self.max_completion_tokens or self.max_tokens or 512

    @property
    def sampling_seed(self) -> int:
        return self.seed if self.seed is not None else secrets.randbits(63)

    @property
    def wants_token_ids(self) -> bool:
        return bool(self.return_token_ids) or self.logprobs


def parse_chat_request(body: Any) -> ChatRequest:
    """Validate a chat-completions body; BadRequest names each bad field and what is wrong with it."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    try:
        return ChatRequest.model_validate(body)
    except ValidationError as exc:
        raise BadRequest("; ".join(f"{'.'.join(str(x) for x in e['loc']) or 'body'}: {e['msg']}"
                                   for e in exc.errors())) from None


def make_app(policy: HFPolicy, model_name: str | None = None) -> FastAPI:
    """The FastAPI app serving `policy` (`model_name` defaults to its `policy_id`)."""
    app = FastAPI(title="envforge policy server")
    created = int(time.time())

    def name() -> str:
        return model_name or policy.policy_id

    @app.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception) -> JSONResponse:  # noqa: ARG001 - FastAPI signature
        return _error(500, f"{type(exc).__name__}: {exc}", "server_error")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "policy_id": policy.policy_id, "version": policy.version}

    @app.get("/metrics")
    async def metrics() -> Response:
        body, content_type = metrics_payload()
        return Response(body, media_type=content_type)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": name(), "object": "model", "created": created,
                                            "owned_by": "envforge", "root": policy.model_path,
                                            "policy_version": policy.version}]}

    @app.post("/v1/reload")
    async def reload(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the request body must be JSON")
        path = body.get("path") if isinstance(body, dict) else None
        if not isinstance(path, str) or not path:
            return _error(400, "reload needs {\"path\": \"<checkpoint directory>\"}")
        try:
            version = await asyncio.to_thread(policy.reload, path)
        except (OSError, ValueError) as exc:
            return _error(400, f"cannot load {path}: {exc}")
        return JSONResponse({"ok": True, "version": version, "policy_id": policy.policy_id})

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        started = time.perf_counter()
        response = await _chat(request)
        live.policy_request(time.perf_counter() - started, response.status_code, getattr(response, "tokens", 0))
        return response

    async def _chat(request: Request) -> JSONResponse:
        try:
            req = parse_chat_request(await request.json())
        except ValueError as exc:  # BadRequest, or a body that is not JSON
            return _error(400, str(exc) if isinstance(exc, BadRequest) else "the request body must be JSON")
        try:
            out = await policy.act(req.chat_messages(), req.tools or [], seed=req.sampling_seed,
                                   temperature=req.sampling_temperature, max_tokens=req.completion_tokens)
        except (ValueError, TypeError, jinja2.TemplateError) as exc:  # template errors on odd messages
            return _error(400, f"cannot render or run this request: {type(exc).__name__}: {exc}")
        version = policy.version
        message: dict[str, Any] = {"role": "assistant", "content": out.text if out.text or not out.tool_calls else None}
        if out.tool_calls:
            message["tool_calls"] = out.tool_calls
        finish = "tool_calls" if out.tool_calls and out.finish_reason == "stop" else out.finish_reason
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        if req.logprobs:
            tok = policy.tokenizer
            entries = []
            for tid, lp in zip(out.token_ids or [], out.logprobs or []):
                piece = tok.decode([tid], skip_special_tokens=False)
                entries.append({"token": piece, "logprob": lp, "bytes": list(piece.encode("utf-8", "replace")),
                                "top_logprobs": []})
            choice["logprobs"] = {"content": entries}
        if req.wants_token_ids:
            choice["token_ids"] = out.token_ids
        n_prompt, n_out = len(out.prompt_token_ids or []), out.n_tokens
        response: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": name(), "choices": [choice],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out},
            "policy_version": version,
        }
        if req.wants_token_ids:
            response["prompt_token_ids"] = out.prompt_token_ids
        reply = JSONResponse(response)
        reply.tokens = n_out  # for the metrics of the route above
        return reply

    return app


def serve(model_path: str, host: str = "127.0.0.1", port: int = 8000, *, device: str = "cpu",
          dtype: str | None = None, model_name: str | None = None, threads: int = 0) -> None:
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
        uvicorn.run(make_app(policy, model_name), host=host, port=port, log_level="info")


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
    a = parser.parse_args()
    serve(a.model_path, a.host, a.port, device=a.device, dtype=a.dtype, model_name=a.model_name, threads=a.threads)
