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
from typing import Any

import jinja2
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from envforge.rollout.policies.hf import HFPolicy

_ROLES = {"system", "user", "assistant", "tool", "developer"}


class BadRequest(ValueError):
    """A request the server will not run; the message goes back to the client with a 400."""


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "code": status}})


def _number(body: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise BadRequest(f"{key} must be a number in [{lo}, {hi}]")
    return float(value)


def _integer(body: dict[str, Any], key: str, default: int | None, lo: int, hi: int) -> int | None:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BadRequest(f"{key} must be an integer in [{lo}, {hi}]")
    return value


def parse_chat_request(body: Any) -> dict[str, Any]:
    """Validate a chat-completions body into keyword arguments for `HFPolicy.generate` plus flags."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") not in _ROLES:
            raise BadRequest(f"messages[{i}] must be an object with a role in {sorted(_ROLES)}")
        content = msg.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise BadRequest(f"messages[{i}].content must be a string, a list of parts or null")
        calls = msg.get("tool_calls")
        well_formed = isinstance(calls, list) and all(
            isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls)
        if calls is not None and not well_formed:
            raise BadRequest(f"messages[{i}].tool_calls must be a list of {{type, function: {{name, arguments}}}}")
    messages = [{**m, "role": "system"} if m["role"] == "developer" else m for m in messages]
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise BadRequest("tools must be a list of objects")
    if body.get("stream"):
        raise BadRequest("stream is not supported")
    if _integer(body, "n", 1, 1, 1) != 1:
        raise BadRequest("n must be 1")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = _integer({"max_tokens": max_tokens}, "max_tokens", 512, 1, 1 << 20)
    seed = _integer(body, "seed", None, -(1 << 63), (1 << 64) - 1)
    logprobs = body.get("logprobs", False)
    if not isinstance(logprobs, bool):
        raise BadRequest("logprobs must be a boolean")
    return {
        "messages": messages, "tools": tools,
        "temperature": _number(body, "temperature", 1.0, 0.0, 100.0),
        "max_tokens": max_tokens,
        "seed": seed if seed is not None else secrets.randbits(63),
        "logprobs": logprobs,
        "return_token_ids": bool(body.get("return_token_ids")) or logprobs,
    }


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
        try:
            req = parse_chat_request(await request.json())
        except ValueError as exc:  # BadRequest, or a body that is not JSON
            return _error(400, str(exc) if isinstance(exc, BadRequest) else "the request body must be JSON")
        try:
            out = await policy.act(req["messages"], req["tools"] or [], seed=req["seed"],
                                   temperature=req["temperature"], max_tokens=req["max_tokens"])
        except (ValueError, TypeError, jinja2.TemplateError) as exc:  # template errors on odd messages
            return _error(400, f"cannot render or run this request: {type(exc).__name__}: {exc}")
        version = policy.version
        message: dict[str, Any] = {"role": "assistant", "content": out.text if out.text or not out.tool_calls else None}
        if out.tool_calls:
            message["tool_calls"] = out.tool_calls
        finish = "tool_calls" if out.tool_calls and out.finish_reason == "stop" else out.finish_reason
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        if req["logprobs"]:
            tok = policy.tokenizer
            entries = []
            for tid, lp in zip(out.token_ids or [], out.logprobs or []):
                piece = tok.decode([tid], skip_special_tokens=False)
                entries.append({"token": piece, "logprob": lp, "bytes": list(piece.encode("utf-8", "replace")),
                                "top_logprobs": []})
            choice["logprobs"] = {"content": entries}
        if req["return_token_ids"]:
            choice["token_ids"] = out.token_ids
        n_prompt, n_out = len(out.prompt_token_ids or []), out.n_tokens
        response: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": name(), "choices": [choice],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out},
            "policy_version": version,
        }
        if req["return_token_ids"]:
            response["prompt_token_ids"] = out.prompt_token_ids
        return JSONResponse(response)

    return app


def serve(model_path: str, host: str = "127.0.0.1", port: int = 8000, *, device: str = "cpu",
          dtype: str | None = None, model_name: str | None = None) -> None:
    """Load a local checkpoint and serve it until interrupted (blocking)."""
    import uvicorn

    policy = HFPolicy(model_path, device=device, dtype=dtype)
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
    a = parser.parse_args()
    serve(a.model_path, a.host, a.port, device=a.device, dtype=a.dtype, model_name=a.model_name)
