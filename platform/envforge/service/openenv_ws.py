"""The OpenEnv protocol on the service: `openenv-core`'s `EnvClient` talks to `/openenv/ws`.

OpenEnv clients hold one WebSocket per episode and send `{"type": "reset"|"step"|"state"|"close",
"data": {...}}`; every answer is `{"type": "observation"|"state"|"error", "data": {...}}` with
`{"observation": {...}, "reward": ..., "done": ...}` for observations. Here a connection is a
session of the service: `reset` opens one (data: task_id / task_set + index / content_hash, seed,
max_turns), `step` sends an action (`{"tool_call": ...}`, `{"text": ...}` or `{"name", "arguments"}`),
and the terminal step carries the verified reward. Closing the connection deletes the session.

The key goes in the handshake (`Authorization: Bearer`, what `EnvforgeEnv` sends) or, for clients
that cannot set headers (`GenericEnvClient`), as `api_key` in the first reset's data. Nothing but
a reset is accepted before a key checks out. Same tenants, scopes, quotas and records as HTTP:
the session manager and the tenant store are the app's (`app.state`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from envforge.service import models as m
from envforge.service.quotas import QuotaExceeded
from envforge.service.sessions import SessionError, SessionManager
from envforge.service.tasks import NotFound

log = logging.getLogger("envforge.service")
PATH = "/openenv/ws"
router = APIRouter()


def _error(code: str, message: str, **extra: Any) -> str:
    return json.dumps({"type": "error", "data": {"message": message, "code": code, **extra}})


def _observation(obs: dict[str, Any], reward: float | None, done: bool) -> str:
    return json.dumps({"type": "observation", "data": {"observation": obs, "reward": reward, "done": done}})


@router.websocket(PATH)
async def openenv(ws: WebSocket) -> None:
    await ws.accept()
    header = ws.headers.get("authorization", "")
    key = header[7:].strip() if header.lower().startswith("bearer ") else ws.headers.get("x-api-key", "")
    authenticate = ws.app.state.store.authenticate
    tenant = authenticate(key) if key else None
    session_id: str | None = None
    mgr: SessionManager = ws.app.state.manager
    try:
        while True:
            raw = await ws.receive_text()
            try:
                msg = json.loads(raw)
                kind, data = msg.get("type", ""), msg.get("data") or {}
                if not isinstance(data, dict):
                    raise ValueError("data must be an object")
            except (ValueError, AttributeError) as exc:
                await ws.send_text(_error("INVALID_JSON", f"not a message: {exc}"))
                continue
            if tenant is None:
                tenant = authenticate(str(data.pop("api_key", ""))) if kind == "reset" else None
                if tenant is None:
                    mgr.metrics.auth_failures.inc()
                    await ws.send_text(_error("UNAUTHORIZED", "missing, unknown or revoked API key"))
                    continue
            data.pop("api_key", None)
            try:
                if kind == "reset":
                    if session_id is not None:
                        await mgr.delete(tenant, session_id)
                        session_id = None
                    req = m.CreateSession.model_validate(data)
                    session, out = await mgr.create(
                        tenant, req.task_id, req.task_set, req.index, req.content_hash, req.seed, req.max_turns
                    )
                    session_id = session.id
                    obs = {**out.pop("observation"), **out}
                    await ws.send_text(_observation(obs, None, False))
                elif kind == "step":
                    if session_id is None:
                        raise SessionError("reset first: no episode on this connection")
                    if "name" in data:
                        data = {
                            "tool_call": {
                                "type": "function",
                                "function": {"name": data["name"], "arguments": data.get("arguments", {})},
                            }
                        }
                    req = m.StepRequest.model_validate(data)
                    call = req.tool_call.model_dump() if req.tool_call is not None else None
                    out = await mgr.step(tenant, session_id, call, req.text)
                    obs = {
                        **out["observation"],
                        "session_id": session_id,
                        "turn": out["turn"],
                        "end_reason": out["end_reason"],
                        "result": out["result"],
                    }
                    reward = out["result"]["reward"] if out["result"] else None
                    await ws.send_text(_observation(obs, reward, out["done"]))
                elif kind == "state":
                    state = mgr.get(tenant, session_id).state() if session_id else {}
                    await ws.send_text(json.dumps({"type": "state", "data": state}))
                elif kind == "close":
                    break
                else:
                    await ws.send_text(_error("UNKNOWN_TYPE", f"unknown message type {kind!r}"))
            except ValidationError as exc:
                await ws.send_text(
                    _error("VALIDATION_ERROR", "invalid message", errors=json.loads(exc.json(include_url=False)))
                )
            except QuotaExceeded as exc:
                mgr.metrics.quota_rejections.labels(tenant.name, exc.quota).inc()
                await ws.send_text(_error("QUOTA_EXCEEDED", str(exc), retry_after_s=exc.retry_after_s))
            except NotFound as exc:
                await ws.send_text(_error("NOT_FOUND", str(exc)))
            except SessionError as exc:
                if exc.status in (410, 503):
                    session_id = None
                await ws.send_text(_error(exc.code.upper(), str(exc)))
    except WebSocketDisconnect:
        pass
    finally:
        if session_id is not None and tenant is not None:
            try:
                await mgr.delete(tenant, session_id)
            except SessionError:
                pass
        try:
            await ws.close()
        except RuntimeError:
            pass
