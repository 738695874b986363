"""The FastAPI app: routes, authentication, error bodies, request caps, metrics, the reaper.

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
from typing import Any, AsyncIterator

from fastapi import Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from envforge import track
from envforge.catalog import Catalog
from envforge.config import Settings
from envforge.rollout.actions import SYSTEM_PROMPT, TOOLS
from envforge.service import models as m
from envforge.service.backend import EnvBackend, backend_from_env
from envforge.service.config import ServiceConfig
from envforge.observe.http import metrics_payload
from envforge.service.metrics import ServiceMetrics
from envforge.service.openenv_ws import add_openenv_route
from envforge.service.quotas import QuotaExceeded, QuotaTracker
from envforge.service.recorder import SessionRecorder
from envforge.service.sessions import SessionError, SessionManager
from envforge.service.tasks import NotFound, TaskDirectory, task_summary
from envforge.service.tenants import Tenant, TenantStore, tenants_path

log = logging.getLogger("envforge.service")
API_VERSION = "1.0.0"


class AuthError(Exception):
    pass


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def _responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    what = {401: "missing, unknown or revoked API key", 404: "no such task set, task or session (for this key)",
            400: "the body is not JSON, or the session cannot do this in its state", 410: "the session is gone (service restart, "
            "idle timeout or infrastructure fault): start a new one", 413: "request body over the size cap",
            429: "a quota is exhausted; see Retry-After", 503: "infrastructure fault or the service is full; retry"}
    out: dict[int | str, dict[str, Any]] = {c: {"model": m.ErrorResponse, "description": what[c]} for c in codes}
    if 429 in out:
        out[429]["headers"] = {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}}
    return out


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
            resp = _error(413, "request_too_large", f"request body over {self.limit} bytes; actions are capped at "
                          "256 KiB (write large files in parts)")
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
                time.perf_counter() - started)


def create_app(settings: Settings, config: ServiceConfig | None = None, backend: EnvBackend | None = None,
               boot_id: str | None = None) -> FastAPI:
    """The service over `settings` (catalog, tenants file, MLflow). Without a backend, the lifespan
    starts one by `backend_from_env`: the sandbox fleet when `ENVFORGE_RAY_ADDRESS` is set, else a
    warm pool on the configured Docker engine."""
    config = config or ServiceConfig()
    metrics = ServiceMetrics()
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings.ensure_dirs()
        store = TenantStore(tenants_path(settings))
        used_backend = backend or await asyncio.to_thread(backend_from_env, settings, config)
        manager = SessionManager(used_backend, TaskDirectory(Catalog(settings.catalog_path)), QuotaTracker(store),
                                 SessionRecorder(settings, config.record_every_sessions, config.record_every_s,
                                                 mlflow=config.mlflow),
                                 metrics, config, boot_id)
        manager.recorder.boot_id = manager.boot_id
        state.update(store=store, manager=manager)

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
            if backend is None:
                await asyncio.to_thread(used_backend.close)
            store.close()

    app = FastAPI(title="envforge environment service", version=API_VERSION, lifespan=lifespan,
                  description="envforge's verified environments for outside RL trainers: list tasks, open a "
                              "session on a task, act with the rollout tools, get the verified reward. "
                              "See docs/service.md.")
    app.state.metrics = metrics
    app.state.service = state
    bearer = HTTPBearer(auto_error=False, description="an API key from `envforge service keys create`")

    def manager() -> SessionManager:
        return state["manager"]

    async def tenant(request: Request,
                     creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> Tenant:
        key = creds.credentials if creds else request.headers.get("x-api-key", "")
        # A direct read: one indexed SQLite row (tens of microseconds) costs less than a thread hop.
        found = state["store"].authenticate(key) if key else None
        if found is None:
            metrics.auth_failures.inc()
            raise AuthError("missing, unknown or revoked API key" if key else
                            "no API key: send `Authorization: Bearer <key>`")
        return found

    @app.exception_handler(AuthError)
    async def _auth(_: Request, exc: AuthError) -> JSONResponse:
        return _error(401, "unauthorized", str(exc), {"WWW-Authenticate": "Bearer"})

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
        return _error(404, "not_found", str(exc))

    @app.exception_handler(SessionError)
    async def _session(_: Request, exc: SessionError) -> JSONResponse:
        return _error(exc.status, exc.code, str(exc))

    @app.exception_handler(QuotaExceeded)
    async def _quota(request: Request, exc: QuotaExceeded) -> JSONResponse:
        return _error(429, "quota_exceeded", str(exc), {"Retry-After": str(exc.retry_after_s)})

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names only the first matching route's methods; list every route's on this path.
            scope = {"type": "http", "path": request.url.path, "method": "GET", "root_path": ""}
            allowed = sorted({meth for r in app.routes if isinstance(r, APIRoute)
                              and r.matches(scope)[0] != Match.NONE for meth in r.methods})
            headers["Allow"] = ", ".join(allowed)
        code = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _error(exc.status_code, code, str(exc.detail), headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
                  for e in exc.errors()]
        return JSONResponse({"detail": errors}, status_code=422)

    def quota_guard(t: Tenant, exc: QuotaExceeded) -> QuotaExceeded:
        metrics.quota_rejections.labels(t.name, exc.quota).inc()
        return exc

    # -- public -------------------------------------------------------------------------------

    @app.get("/healthz", response_model=m.Health, tags=["service"])
    async def healthz() -> dict[str, Any]:
        mgr = manager()
        return {"status": "ok", "boot_id": mgr.boot_id, "sessions_open": mgr.open_count(),
                "backend": await asyncio.to_thread(mgr.backend.stats)}  # the fleet's asks its nodes

    @app.get("/metrics", tags=["service"], response_class=Response,
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                              "description": "Prometheus text exposition"}})
    async def prometheus() -> Response:
        body, content_type = metrics_payload(metrics.registry)  # the app's own, and the process's sandboxes
        return Response(body, media_type=content_type)

    # -- tasks --------------------------------------------------------------------------------

    @app.get("/task-sets", response_model=m.TaskSetList, tags=["tasks"], responses=_responses(401))
    async def list_task_sets(t: Tenant = Depends(tenant)) -> dict[str, Any]:
        infos = await asyncio.to_thread(manager().directory.task_sets, t)
        return {"task_sets": [i.__dict__ for i in infos]}

    @app.get("/task-sets/{task_set}/tasks", response_model=m.TaskList, tags=["tasks"], responses=_responses(401, 404))
    async def list_tasks(task_set: str, t: Tenant = Depends(tenant)) -> dict[str, Any]:
        info, tasks = await asyncio.to_thread(manager().directory.tasks, t, task_set)
        return {"task_set": info.__dict__, "system_prompt": SYSTEM_PROMPT, "tools": TOOLS,
                "tasks": [task_summary(s) for s in tasks]}

    # -- sessions -----------------------------------------------------------------------------

    @app.post("/sessions", response_model=m.SessionOut, status_code=201, tags=["sessions"],
              responses=_responses(400, 401, 404, 413, 429, 503))
    async def create_session(body: m.CreateSession, t: Tenant = Depends(tenant)) -> dict[str, Any]:
        try:
            _, out = await manager().create(t, body.task_id, body.task_set, body.index, body.content_hash,
                                            body.seed, body.max_turns)
        except QuotaExceeded as exc:
            raise quota_guard(t, exc) from None
        return out

    @app.get("/sessions", response_model=m.SessionList, tags=["sessions"], responses=_responses(401))
    async def list_sessions(t: Tenant = Depends(tenant)) -> dict[str, Any]:
        return {"sessions": [s.state() for s in manager().sessions_of(t)]}

    @app.get("/sessions/{session_id}", response_model=m.SessionState, tags=["sessions"],
             responses=_responses(401, 404, 410))
    async def get_session(session_id: str, t: Tenant = Depends(tenant)) -> dict[str, Any]:
        return manager().get(t, session_id).state()

    @app.post("/sessions/{session_id}/step", response_model=m.StepOut, tags=["sessions"],
              responses=_responses(400, 401, 404, 410, 413, 429, 503))
    async def step(session_id: str, body: m.StepRequest, t: Tenant = Depends(tenant)) -> dict[str, Any]:
        call = body.tool_call.model_dump() if body.tool_call is not None else None
        try:
            return await manager().step(t, session_id, call, body.text)
        except QuotaExceeded as exc:
            raise quota_guard(t, exc) from None

    @app.post("/sessions/{session_id}/verify", response_model=m.VerifyOut, tags=["sessions"],
              responses=_responses(401, 404, 410, 429, 503))
    async def verify(session_id: str, t: Tenant = Depends(tenant)) -> dict[str, Any]:
        try:
            return await manager().verify(t, session_id)
        except QuotaExceeded as exc:
            raise quota_guard(t, exc) from None

    @app.delete("/sessions/{session_id}", response_model=m.SessionClosed, tags=["sessions"],
                responses=_responses(401, 404, 410))
    async def delete_session(session_id: str, t: Tenant = Depends(tenant)) -> dict[str, Any]:
        return await manager().delete(t, session_id)

    add_openenv_route(app, manager, lambda key: state["store"].authenticate(key))
    app.add_middleware(RequestMetrics, metrics=metrics)
    app.add_middleware(BodySizeLimit, limit=config.max_request_bytes)
    return app


def openapi_spec(app: FastAPI | None = None) -> dict[str, Any]:
    """The spec checked in as docs/service-openapi.json (a test fails when it is stale)."""
    app = app or create_app(Settings.from_env())
    return app.openapi()
