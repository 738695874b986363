"""The OpenEnv protocol on the service: `openenv-core`'s `EnvClient` talks to `/openenv/ws`.

OpenEnv clients hold one WebSocket per episode and send `{"type": "reset"|"step"|"state"|"mcp"|"close",
"data": {...}}`; every answer is `{"type": "observation"|"state"|"mcp"|"error", "data": {...}}` with
`{"observation": {...}, "reward": ..., "done": ...}` for observations. Here a connection is a
session of the service: `reset` opens one (data: task_id / task_set + index / content_hash, seed,
max_turns, OpenEnv's episode_id), `step` sends an action in any form `openenv_protocol` takes
(envforge's `{"name", "arguments"}`, `{"tool_call"}`, `{"text"}`, OpenEnv's MCP `call_tool` /
`list_tools`), `mcp` carries MCP JSON-RPC (`tools/list`, `tools/call` = a step of this episode), and
the terminal step carries the verified reward. Closing the connection deletes the session.

The key goes in the handshake (`Authorization: Bearer`, what `EnvforgeEnv` sends) or, for clients
that cannot set headers (`GenericEnvClient`, `MCPToolClient`), as `api_key` in the first reset's
data. Nothing but a reset is accepted before a key checks out. Same tenants, scopes, quotas and
records as HTTP: the session manager and the tenant store are the app's (`app.state`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from envforge.service import openenv_protocol as protocol
from envforge.service.quotas import QuotaExceeded
from envforge.service.sessions import SessionError, SessionManager
from envforge.service.tasks import NotFound

log = logging.getLogger("envforge.service")
PATH = "/openenv/ws"
router = APIRouter()


def _error(code: str, message: str, **extra: Any) -> str:
    return json.dumps({"type": "error", "data": {"message": message, "code": code, **extra}})


@router.websocket(PATH)
async def openenv(ws: WebSocket) -> None:
    await ws.accept()
    header = ws.headers.get("authorization", "")
    key = header[7:].strip() if header.lower().startswith("bearer ") else ws.headers.get("x-api-key", "")
    authenticate = ws.app.state.store.authenticate
    tenant = authenticate(key) if key else None
    session_id: str | None = None
    episode_id: str | None = None
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
                    episode_id = data.get("episode_id")
                    session_id, result = await protocol.reset(mgr, tenant, data)
                    await ws.send_text(json.dumps({"type": "observation", "data": result}))
                elif kind == "step":
                    result = await protocol.step(mgr, tenant, session_id, data)
                    await ws.send_text(json.dumps({"type": "observation", "data": result}))
                elif kind == "state":
                    state = protocol.state_of(mgr, tenant, session_id, episode_id) if session_id else {}
                    await ws.send_text(json.dumps({"type": "state", "data": state}))
                elif kind == "mcp":
                    answer = await protocol.mcp(mgr, tenant, data, session_id, over_http=False)
                    await ws.send_text(json.dumps({"type": "mcp", "data": answer}))
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
