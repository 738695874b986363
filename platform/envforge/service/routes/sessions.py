"""Sessions: open one on a task, act in it, verify it, close it (each scoped to the caller's tenant)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from fastapi import APIRouter, Depends, Request

from envforge.service import models as m
from envforge.service.quotas import QuotaExceeded
from envforge.service.routes.deps import quota_rejected, responses, session_manager, tenant
from envforge.service.sessions import SessionManager
from envforge.service.tenants import Tenant

router = APIRouter(tags=["sessions"])
LOCAL_ONLY = "x-envforge-replica-local"  # GET /sessions from a peer replica: this replica's sessions only


@router.post(
    "/sessions", response_model=m.SessionOut, status_code=201, responses=responses(400, 401, 404, 413, 429, 503)
)
async def create_session(
    body: m.CreateSession, t: Tenant = Depends(tenant), mgr: SessionManager = Depends(session_manager)
) -> dict[str, Any]:
    try:
        _, out = await mgr.create(
            t, body.task_id, body.task_set, body.index, body.content_hash, body.seed, body.max_turns
        )
    except QuotaExceeded as exc:
        raise quota_rejected(mgr, t, exc) from None
    return out


@router.get("/sessions", response_model=m.SessionList, responses=responses(401))
async def list_sessions(
    request: Request, t: Tenant = Depends(tenant), mgr: SessionManager = Depends(session_manager)
) -> dict[str, Any]:
    sessions = [s.state() for s in mgr.sessions_of(t)]
    if request.headers.get(LOCAL_ONLY):  # a peer replica asking for this one's part
        return {"sessions": sessions}
    peers = await asyncio.to_thread(mgr.quotas.shared.peers_serving, t.name)
    if peers:  # a replica set: the tenant's sessions on the other replicas, asked with the caller's key
        headers = {k: v for k, v in request.headers.items() if k in ("authorization", "x-api-key")}
        async with httpx.AsyncClient(timeout=10, headers={**headers, LOCAL_ONLY: "1"}) as http:
            answers = await asyncio.gather(*(http.get(url + "/sessions") for url in peers), return_exceptions=True)
        for answer in answers:  # a replica that died meanwhile has no sessions to list
            if isinstance(answer, httpx.Response) and answer.status_code == 200:
                sessions += answer.json()["sessions"]
    return {"sessions": sessions}


@router.get("/sessions/{session_id}", response_model=m.SessionState, responses=responses(401, 404, 410))
async def get_session(
    session_id: str, t: Tenant = Depends(tenant), mgr: SessionManager = Depends(session_manager)
) -> dict[str, Any]:
    return mgr.get(t, session_id).state()


@router.post(
    "/sessions/{session_id}/step", response_model=m.StepOut, responses=responses(400, 401, 404, 410, 413, 429, 503)
)
async def step(
    session_id: str, body: m.StepRequest, t: Tenant = Depends(tenant), mgr: SessionManager = Depends(session_manager)
) -> dict[str, Any]:
    call = body.tool_call.model_dump() if body.tool_call is not None else None
    try:
        return await mgr.step(t, session_id, call, body.text)
    except QuotaExceeded as exc:
        raise quota_rejected(mgr, t, exc) from None


@router.post("/sessions/{session_id}/verify", response_model=m.VerifyOut, responses=responses(401, 404, 410, 429, 503))
async def verify(
    session_id: str, t: Tenant = Depends(tenant), mgr: SessionManager = Depends(session_manager)
) -> dict[str, Any]:
    try:
        return await mgr.verify(t, session_id)
    except QuotaExceeded as exc:
        raise quota_rejected(mgr, t, exc) from None


@router.delete("/sessions/{session_id}", response_model=m.SessionClosed, responses=responses(401, 404, 410))
async def delete_session(
    session_id: str, t: Tenant = Depends(tenant), mgr: SessionManager = Depends(session_manager)
) -> dict[str, Any]:
    return await mgr.delete(t, session_id)
