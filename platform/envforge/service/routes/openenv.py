"""OpenEnv 0.3's HTTP surface under /openenv: what its own server (`openenv.core.env_server`)
serves at the root of an environment, so an OpenEnv client given `<service>/openenv` as its base
URL finds /ws, /mcp, /reset, /step, /state, /health, /schema and /metadata where it looks.

OpenEnv's own /reset and /step are stateless (a fresh environment per request); envforge's are
not: /reset opens a session and its observation carries `session_id`, which /step (in the body)
and /state (a query parameter) name, as OpenEnv's HTTP MCP names `params.session_id` from
`openenv/session/create`. A session ends on its terminal step (the sandbox goes back) and is
deleted by `DELETE /sessions/{id}`, `openenv/session/close` or the idle timeout.
/health, /schema and /metadata need no key (probes, as OpenEnv's providers poll /health); the
rest take the service's key (`Authorization: Bearer`), with the same quotas and records as
/sessions.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Request

from envforge.service import models as m
from envforge.service import openenv_protocol as protocol
from envforge.service.quotas import QuotaExceeded
from envforge.service.routes.deps import quota_rejected, responses, session_manager, tenant
from envforge.service.sessions import SessionManager
from envforge.service.tenants import Tenant

PREFIX = "/openenv"
router = APIRouter(prefix=PREFIX, tags=["openenv"])


@router.post(
    "/reset",
    response_model=m.OpenEnvResult,
    response_model_exclude_unset=True,
    responses=responses(400, 401, 404, 413, 429, 503),
)
async def reset(
    body: m.OpenEnvResetRequest, t: Tenant = Depends(tenant), mgr: SessionManager = Depends(session_manager)
) -> dict[str, Any]:
    try:
        _, result = await protocol.reset(mgr, t, body.model_dump(exclude_unset=True))
    except QuotaExceeded as exc:
        raise quota_rejected(mgr, t, exc) from None
    return result


@router.post(
    "/step",
    response_model=m.OpenEnvResult,
    response_model_exclude_unset=True,
    responses=responses(400, 401, 404, 410, 413, 429, 503),
)
async def step(
    body: m.OpenEnvStepRequest, t: Tenant = Depends(tenant), mgr: SessionManager = Depends(session_manager)
) -> dict[str, Any]:
    try:
        return await protocol.step(mgr, t, body.session_id, body.action.model_dump(exclude_unset=True))
    except QuotaExceeded as exc:
        raise quota_rejected(mgr, t, exc) from None


@router.get("/state", response_model=m.OpenEnvState, responses=responses(401, 404, 410))
async def state(
    session_id: str = Query(..., max_length=200, description="the episode (from /reset's observation)"),
    t: Tenant = Depends(tenant),
    mgr: SessionManager = Depends(session_manager),
) -> dict[str, Any]:
    return protocol.state_of(mgr, t, session_id)


@router.get("/health", response_model=m.OpenEnvHealth)
async def health() -> dict[str, Any]:
    return {"status": "healthy"}


@router.get("/metadata", response_model=m.OpenEnvMetadata)
async def metadata(request: Request) -> dict[str, Any]:
    return {
        "name": "envforge",
        "description": "envforge's verified software-engineering tasks: reset on a task (task_id, task_set + "
        "index or content_hash), act with its tools (run, apply_patch, submit, ...), get the verified reward "
        "on the terminal step",
        "version": request.app.version,  # the service API's
        "documentation_url": "docs/service.md#openenv",
    }


@router.get("/schema", response_model=m.OpenEnvSchema)
async def schema() -> dict[str, Any]:
    return {
        "action": m.OpenEnvAction.model_json_schema(),
        "observation": m.OpenEnvObservation.model_json_schema(),
        "state": m.OpenEnvState.model_json_schema(),
    }


@router.post(
    "/mcp", response_model=m.OpenEnvJsonRpcResponse, response_model_exclude_unset=True, responses=responses(401)
)
async def mcp(
    body: Annotated[
        Any, Body(description="a JSON-RPC 2.0 request: tools/list, tools/call, openenv/session/create|close")
    ],
    t: Tenant = Depends(tenant),
    mgr: SessionManager = Depends(session_manager),
) -> dict[str, Any]:
    return await protocol.mcp(mgr, t, body, over_http=True)
