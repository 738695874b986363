"""OpenEnv 0.3's protocol over envforge sessions, shared by the HTTP routes (`routes.openenv`) and
the WebSocket endpoint (`openenv_ws`), so both speak it one way.

OpenEnv's wire shapes: a reset or step answers `{"observation": {...}, "reward": ..., "done": ...}`;
a state is `{"episode_id", "step_count", ...}`; MCP is JSON-RPC 2.0 (`tools/list`, `tools/call`, and
OpenEnv's `openenv/session/create` / `openenv/session/close` for HTTP sessions). An envforge session
is the OpenEnv episode: its id is the `session_id` that HTTP steps, states and MCP calls name.

Actions come in every form an OpenEnv client sends: `{"name", "arguments"}` (envforge's tools),
`{"tool_call": ...}` (an OpenAI tool call), `{"text": ...}` (a reply holding a `<tool_call>`), and
OpenEnv's MCP actions `{"type": "call_tool", "tool_name", "arguments"}` (a step, answered as MCP's
`CallToolObservation`) and `{"type": "list_tools"}` (envforge's tools in MCP's form; no turn used).
This module imports nothing of openenv-core: the service does not depend on it.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from envforge.rollout.actions import TOOLS
from envforge.service import models as m
from envforge.service.quotas import QuotaExceeded
from envforge.service.sessions import SessionError, SessionManager, SessionNotFound
from envforge.service.tasks import NotFound
from envforge.service.tenants import Tenant

# JSON-RPC 2.0 error codes (OpenEnv's JsonRpcErrorCode).
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, SERVER_ERROR = -32700, -32600, -32601, -32602, -32000


def mcp_tools() -> list[dict[str, Any]]:
    """envforge's tools in MCP's form (name, description, inputSchema)."""
    return [
        {
            "name": t["function"]["name"],
            "description": t["function"].get("description", ""),
            "inputSchema": t["function"].get("parameters", {"type": "object"}),
        }
        for t in TOOLS
    ]


def state_of(mgr: SessionManager, tenant: Tenant, session_id: str, episode_id: str | None = None) -> dict[str, Any]:
    state = mgr.get(tenant, session_id).state()
    return {**state, "episode_id": episode_id or session_id, "step_count": state["turn"]}


async def reset(mgr: SessionManager, tenant: Tenant, data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Open a session (data: CreateSession's fields, plus OpenEnv's episode_id); (session id, result)."""
    data = dict(data)
    episode_id = data.pop("episode_id", None)
    req = m.CreateSession.model_validate(data)
    session, out = await mgr.create(
        tenant, req.task_id, req.task_set, req.index, req.content_hash, req.seed, req.max_turns
    )
    obs = {**out.pop("observation"), **out}
    if episode_id is not None:
        obs["episode_id"] = str(episode_id)
    return session.id, {"observation": obs, "reward": None, "done": False}


async def step(mgr: SessionManager, tenant: Tenant, session_id: str | None, data: dict[str, Any]) -> dict[str, Any]:
    """One action (any form) in the session; raises ValidationError for a malformed one."""
    action = m.OpenEnvAction.model_validate(data)
    if action.type == "list_tools":
        return {"observation": {"tools": mcp_tools()}, "reward": None, "done": False}
    if session_id is None:  # 404 as for any session this key cannot name
        raise SessionNotFound("no episode: reset first (over HTTP: send the session_id /openenv/reset returned)")
    call, text = _step_args(action)
    out = await mgr.step(tenant, session_id, call, text)
    reward = out["result"]["reward"] if out["result"] else None
    if action.type == "call_tool":
        obs = {
            "tool_name": action.tool_name,
            "result": tool_result(out, reward),
            "error": None,
            "metadata": {"session_id": session_id, "turn": out["turn"], "end_reason": out["end_reason"]},
        }
    else:
        obs = {
            **out["observation"],
            "session_id": session_id,
            "turn": out["turn"],
            "end_reason": out["end_reason"],
            "result": out["result"],
        }
    return {"observation": obs, "reward": reward, "done": out["done"]}


def _step_args(action: m.OpenEnvAction) -> tuple[dict[str, Any] | None, str | None]:
    """The (tool_call, text) pair SessionManager.step takes."""
    name = action.tool_name if action.type == "call_tool" else action.name
    if name is not None:
        return {"type": "function", "function": {"name": name, "arguments": action.arguments}}, None
    if action.tool_call is not None:
        return action.tool_call.model_dump(), None
    return None, action.text


def tool_result(out: dict[str, Any], reward: float | None) -> dict[str, Any]:
    """A step as MCP's CallToolResult; `data` (what FastMCP clients and OpenEnv's call_tool return)
    is the structured content: the output, the turn, done, the reward and the verification."""
    o = out["observation"]
    content = {
        **o,
        "turn": out["turn"],
        "done": out["done"],
        "end_reason": out["end_reason"],
        "reward": reward,
        "verification": out["result"],
    }
    return {
        "content": [{"type": "text", "text": o["text"]}],
        "structuredContent": content,
        "data": content,
        "isError": o["error"] is not None,
    }


def _rpc_error(request_id: Any, rpc_code: int, message: str, **data: Any) -> dict[str, Any]:
    error: dict[str, Any] = {"code": rpc_code, "message": message, "data": data or None}
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


async def mcp(
    mgr: SessionManager, tenant: Tenant, request: Any, session_id: str | None = None, *, over_http: bool
) -> dict[str, Any]:
    """Answer one MCP JSON-RPC request. Over WebSocket the session is the connection's (`session_id`);
    over HTTP a call names it in `params.session_id`, from `openenv/session/create` (whose params are
    CreateSession's fields: the task to play)."""
    if not isinstance(request, dict) or request.get("jsonrpc") != "2.0" or not isinstance(request.get("method"), str):
        rid = request.get("id") if isinstance(request, dict) else None
        return _rpc_error(rid, INVALID_REQUEST, 'not a JSON-RPC 2.0 request: needs "jsonrpc": "2.0" and a method')
    rid, method, params = request.get("id"), request["method"], request.get("params") or {}
    if not isinstance(params, dict):
        return _rpc_error(rid, INVALID_PARAMS, "params must be an object")
    if over_http:
        session_id = params.pop("session_id", None)
    try:
        if method == "tools/list":
            return {"jsonrpc": "2.0", "id": rid, "result": {"tools": mcp_tools()}}
        if method == "tools/call":
            name = params.get("name")
            if not isinstance(name, str) or not name:
                return _rpc_error(rid, INVALID_PARAMS, "tools/call needs params.name (the tool)")
            if session_id is None:
                where = "params.session_id from openenv/session/create" if over_http else "a reset first"
                return _rpc_error(rid, INVALID_PARAMS, f"tools/call needs an episode: {where}")
            action = {"type": "call_tool", "tool_name": name, "arguments": params.get("arguments") or {}}
            result = await step(mgr, tenant, session_id, action)
            return {"jsonrpc": "2.0", "id": rid, "result": result["observation"]["result"]}
        if method == "openenv/session/create":
            if not over_http:
                if session_id is None:
                    return _rpc_error(rid, INVALID_REQUEST, "over WebSocket the episode is the connection's: reset")
                return {"jsonrpc": "2.0", "id": rid, "result": {"session_id": session_id}}
            created, _ = await reset(mgr, tenant, params)
            return {"jsonrpc": "2.0", "id": rid, "result": {"session_id": created}}
        if method == "openenv/session/close":
            target = params.get("session_id") if not over_http else session_id
            if not target:
                return _rpc_error(rid, INVALID_PARAMS, "openenv/session/close needs params.session_id")
            if not over_http and target == session_id:
                return _rpc_error(rid, INVALID_REQUEST, "the connection's own episode closes with the connection")
            await mgr.delete(tenant, target)
            return {"jsonrpc": "2.0", "id": rid, "result": {"session_id": target, "closed": True}}
        return _rpc_error(
            rid, METHOD_NOT_FOUND, f"method not found: {method} (tools/list, tools/call, openenv/session/*)"
        )
    except ValidationError as exc:
        return _rpc_error(
            rid, INVALID_PARAMS, "invalid params", errors=exc.errors(include_url=False, include_context=False)
        )
    except QuotaExceeded as exc:
        mgr.metrics.quota_rejections.labels(tenant.name, exc.quota).inc()  # as routes.deps.quota_rejected
        return _rpc_error(rid, SERVER_ERROR, str(exc), code="quota_exceeded", retry_after_s=exc.retry_after_s)
    except (NotFound, SessionNotFound) as exc:
        return _rpc_error(rid, INVALID_PARAMS, str(exc), code="not_found")
    except SessionError as exc:
        return _rpc_error(rid, SERVER_ERROR, str(exc), code=exc.code)
