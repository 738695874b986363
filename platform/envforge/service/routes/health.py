"""/healthz and /metrics: no key needed (probes and Prometheus)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Response

from envforge.observe.http import metrics_payload
from envforge.service import models as m
from envforge.service.metrics import ServiceMetrics
from envforge.service.routes.deps import service_metrics, session_manager
from envforge.service.sessions import SessionManager

router = APIRouter(tags=["service"])


@router.get("/healthz", response_model=m.Health)
async def healthz(mgr: SessionManager = Depends(session_manager)) -> dict[str, Any]:
    return {
        "status": "ok",
        "boot_id": mgr.boot_id,
        "sessions_open": mgr.open_count(),
        "backend": await asyncio.to_thread(mgr.backend.stats),
    }  # the fleet's asks its nodes


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text exposition"}
    },
)
async def prometheus(metrics: ServiceMetrics = Depends(service_metrics)) -> Response:
    body, content_type = metrics_payload(metrics.registry)  # the app's own, and the process's sandboxes
    return Response(body, media_type=content_type)
