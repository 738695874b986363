"""The FastAPI app: the factory that puts the service together (lifespan, error bodies, request
caps, metrics, the reaper) from the routers in `envforge.service.routes`.

    app = create_app(settings, ServiceConfig())          # sandboxes: the fleet or the local pool
    uvicorn.run(app, host=..., port=...)                 # `envforge service serve` does this

Every route but /healthz, /metrics and the spec needs `Authorization: Bearer <key>` (or
`X-API-Key`). Errors are `{"error": {"code", "message"}}` with the status the OpenAPI spec
lists; 429 carries `Retry-After`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, AsyncIterator, Callable, Coroutine

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from envforge import track
from envforge.catalog import Catalog
from envforge.config import Settings
from envforge.rollout.actions import SYSTEM_PROMPT, TOOLS
from envforge.service import models as m
from envforge.service.backend import EnvBackend, backend_from_env
from envforge.service.config import ServiceConfig
from envforge.service.metrics import ServiceMetrics
from envforge.service.quotas import QuotaExceeded, QuotaTracker
from envforge.service.recorder import SessionRecorder
from envforge.service.routes import HTTP_ROUTERS, ROUTERS
from envforge.service.routes.deps import AuthError
from envforge.service.sessions import SessionError, SessionManager, new_boot_id
from envforge.service.shared_quotas import SharedQuotaState
from envforge.service.tasks import NotFound, TaskDirectory
from envforge.service.tenants import TenantStore, tenants_path

log = logging.getLogger("envforge.service")
API_VERSION = "1.0.0"


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = m.ErrorResponse(error=m.ErrorDetail(code=code, message=message))  # the body the spec lists
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


class BodySizeLimit:
    """Pure ASGI: refuse bodies over `limit` bytes (declared or streamed) with 413 before routing."""

    def __init__(self, app: Any, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        too_big = declared is not None and declared.isdigit() and int(declared) > self.limit
        messages: list[dict] = []
        if not too_big and scope.get("method") in ("POST", "PUT", "PATCH"):
            size = 0
            while True:
                message = await receive()
                messages.append(message)
                size += len(message.get("body", b""))
                if size > self.limit:
                    too_big = True
                    break
                if message["type"] != "http.request" or not message.get("more_body"):
                    break
        if too_big:
            resp = _error(
                413,
                "request_too_large",
                f"request body over {self.limit} bytes; actions are capped at 256 KiB (write large files in parts)",
            )
            await resp(scope, receive, send)
            return

        async def replay() -> dict:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay if messages else receive, send)


class RequestMetrics:
    """Pure ASGI: request latency by route template and status."""

    def __init__(self, app: Any, metrics: ServiceMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = {"code": 500}

        async def send_status(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.requests.labels(scope.get("method", ""), route, str(status["code"])).observe(
                time.perf_counter() - started
            )


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Open the tenant store and the session manager (on the given backend, or one `backend_from_env`
    starts), reap idle sessions while the app runs, and close it all in order at shutdown."""
    settings: Settings = app.state.settings
    config: ServiceConfig = app.state.config
    given: EnvBackend | None = app.state.given_backend
    settings.ensure_dirs()
    store = TenantStore(tenants_path(settings))
    boot_id = app.state.boot_id or new_boot_id(config.replica)
    url = f"http://{config.host}:{config.port}" if config.replica else ""  # where peers list its sessions
    quotas = QuotaTracker(store, SharedQuotaState(store.path, boot_id, config.lease_ttl_s, url=url))
    used_backend = given or await asyncio.to_thread(backend_from_env, settings, config)
    manager = SessionManager(
        used_backend,
        TaskDirectory(Catalog(settings.catalog_path)),
        quotas,
        SessionRecorder(settings, config.record_every_sessions, config.record_every_s, mlflow=config.mlflow),
        app.state.metrics,
        config,
        boot_id,
    )
    manager.recorder.boot_id = manager.boot_id
    app.state.store, app.state.manager = store, manager

    async def reaper() -> None:
        while True:
            await asyncio.sleep(config.reap_interval_s)
            try:
                await manager.reap()
            except Exception:
                log.exception("reaper tick failed")

    async def warm_tracking() -> None:
        # MLflow's first use (import, store migrations) takes seconds: pay it at start-up, not in the
        # first batch, and say early when the tracking server cannot be reached.
        if not config.mlflow:
            return
        try:
            await asyncio.to_thread(track.experiment_id, settings)
        except Exception as exc:
            log.warning("MLflow is not reachable yet (%s); session batches will retry it", exc)

    task = asyncio.create_task(reaper())
    warm = asyncio.create_task(warm_tracking())
    log.info("envforge service ready (boot %s)", manager.boot_id)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await warm
        await manager.shutdown()
        if given is None:
            await asyncio.to_thread(used_backend.close)
        quotas.close()
        store.close()


async def _auth(_: Request, exc: AuthError) -> JSONResponse:
    return _error(401, "unauthorized", str(exc), {"WWW-Authenticate": "Bearer"})


async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
    return _error(404, "not_found", str(exc))


async def _session(_: Request, exc: SessionError) -> JSONResponse:
    return _error(exc.status, exc.code, str(exc))


async def _quota(_: Request, exc: QuotaExceeded) -> JSONResponse:
    return _error(429, "quota_exceeded", str(exc), {"Retry-After": str(exc.retry_after_s)})


async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        # Starlette names only the first matching route's methods; list every route's on this path.
        scope = {"type": "http", "path": request.url.path, "method": "GET", "root_path": ""}
        allowed = sorted(
            {
                meth
                for router in HTTP_ROUTERS
                for r in router.routes
                if isinstance(r, APIRoute) and r.matches(scope)[0] != Match.NONE
                for meth in r.methods
            }
        )
        headers["Allow"] = ", ".join(allowed)
    code = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return _error(exc.status_code, code, str(exc.detail), headers)


async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
    errors = [
        {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
        for e in exc.errors()
    ]
    return JSONResponse({"detail": errors}, status_code=422)


# Every error as `{"error": {"code", "message"}}` with the status the spec lists (validation: FastAPI's 422 body).
_ERROR_HANDLERS: dict[int | type[Exception], Callable[[Request, Any], Coroutine[Any, Any, Response]]] = {
    AuthError: _auth,
    NotFound: _not_found,
    SessionError: _session,
    QuotaExceeded: _quota,
    StarletteHTTPException: _http,
    RequestValidationError: _invalid,
}


def create_app(
    settings: Settings,
    config: ServiceConfig | None = None,
    backend: EnvBackend | None = None,
    boot_id: str | None = None,
) -> FastAPI:
    """The service over `settings` (catalog, tenants file, MLflow). Without a backend, the lifespan
    starts one by `backend_from_env`: the sandbox fleet when `ENVFORGE_RAY_ADDRESS` is set, else a
    warm pool on the configured Docker engine."""
    config = config or ServiceConfig()
    app = FastAPI(
        title="envforge environment service",
        version=API_VERSION,
        lifespan=_lifespan,
        exception_handlers=_ERROR_HANDLERS,
        description="envforge's verified environments for outside RL trainers: list tasks, open a "
        "session on a task, act with the rollout tools, get the verified reward. "
        "See docs/service.md.",
    )
    app.state.settings, app.state.config, app.state.given_backend, app.state.boot_id = (
        settings,
        config,
        backend,
        boot_id,
    )
    app.state.metrics = ServiceMetrics()
    # What a task listing tells trainers to act with: the prompt and tools of envforge's own rollouts.
    app.state.instructions = {"system_prompt": SYSTEM_PROMPT, "tools": TOOLS}
    for router in ROUTERS:
        app.include_router(router)
    app.add_middleware(RequestMetrics, metrics=app.state.metrics)
    app.add_middleware(BodySizeLimit, limit=config.max_request_bytes)
    return app


def openapi_spec(app: FastAPI | None = None) -> dict[str, Any]:
    """The spec checked in as docs/service-openapi.json (a test fails when it is stale)."""
    app = app or create_app(Settings.from_env())
    return app.openapi()
