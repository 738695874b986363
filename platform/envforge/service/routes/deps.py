"""What routes depend on, read from `app.state` (set by `app.create_app` and its lifespan): the
session manager, the tenant behind the request's API key, the metrics, what task listings tell
trainers; and the error responses routes declare in the OpenAPI spec."""

from __future__ import annotations

from typing import Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from envforge.service import models as m
from envforge.service.metrics import ServiceMetrics
from envforge.service.quotas import QuotaExceeded
from envforge.service.sessions import SessionManager
from envforge.service.tenants import Tenant

bearer = HTTPBearer(auto_error=False, description="an API key from `envforge service keys create`")


class AuthError(Exception):
    """No key, or one that is unknown or revoked: answered 401 by the app's handler."""


def session_manager(request: Request) -> SessionManager:
    return request.app.state.manager


def service_metrics(request: Request) -> ServiceMetrics:
    return request.app.state.metrics


def instructions(request: Request) -> dict[str, Any]:
    """The system prompt and tools a task listing gives trainers (`app.state.instructions`)."""
    return request.app.state.instructions


async def tenant(request: Request, creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> Tenant:
    key = creds.credentials if creds else request.headers.get("x-api-key", "")
    # A direct read: one indexed SQLite row (tens of microseconds) costs less than a thread hop.
    found = request.app.state.store.authenticate(key) if key else None
    if found is None:
        request.app.state.metrics.auth_failures.inc()
        raise AuthError(
            "missing, unknown or revoked API key" if key else "no API key: send `Authorization: Bearer <key>`"
        )
    return found


def quota_rejected(manager: SessionManager, t: Tenant, exc: QuotaExceeded) -> QuotaExceeded:
    """Count a quota rejection by tenant and quota; returns the exception to raise (answered 429)."""
    manager.metrics.quota_rejections.labels(t.name, exc.quota).inc()
    return exc


def responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The error statuses a route lists in the spec, each with the error body's model."""
    what = {
        401: "missing, unknown or revoked API key",
        404: "no such task set, task or session (for this key)",
        400: "the body is not JSON, or the session cannot do this in its state",
        410: "the session is gone (service restart, idle timeout or infrastructure fault): start a new one",
        413: "request body over the size cap",
        429: "a quota is exhausted; see Retry-After",
        503: "infrastructure fault or the service is full; retry",
    }
    out: dict[int | str, dict[str, Any]] = {c: {"model": m.ErrorResponse, "description": what[c]} for c in codes}
    if 429 in out:
        out[429]["headers"] = {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}}
    return out
