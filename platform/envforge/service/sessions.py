"""Sessions: one episode of one task for one tenant, on a sandbox from the backend.

A session wraps the rollout environment (`RolloutEnv`): the same reset, the same tool actions
(OpenAI tool calls or `<tool_call>` text; malformed ones are error observations), the same
limits, and grading on a pristine copy. Requests to one session are serialized; sessions of
different tenants share nothing but the pool.

Ids are `<boot id>-<random>`. The boot id changes with every start of the service, so a client
whose session died with a restart gets 410 "session lost" instead of a confusing 404, and no
lookup is needed to say so. A replica of a replica set (`ServiceConfig.replica`, docs/service.md)
has the boot id `<replica>.<random>`, so the proxy in front routes a session's requests to the
replica that holds it by the id alone. A session reaped for idleness or lost to an infrastructure fault
also answers 410 for a while (to its own tenant only); ids of other tenants always answer 404.
When the episode ends it is graded at once and its sandbox goes back to the pool; the session
keeps its result until it is deleted or reaped.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from envforge.errors import EnvforgeError, InfraError
from envforge.rollout.actions import SYSTEM_PROMPT, TOOLS, ActionError, parse_text, parse_tool_call
from envforge.rollout.env import EnvLimits, Observation, RolloutEnv
from envforge.service.backend import EnvBackend
from envforge.service.config import ServiceConfig
from envforge.service.metrics import ServiceMetrics
from envforge.service.quotas import QuotaExceeded, QuotaTracker
from envforge.service.recorder import SessionRecord, SessionRecorder
from envforge.service.tasks import ServedTask, TaskDirectory, TaskSetInfo
from envforge.service.tenants import Tenant

log = logging.getLogger("envforge.service")


class SessionError(Exception):
    status = 400
    code = "invalid_request"


class SessionNotFound(SessionError):
    status, code = 404, "not_found"


class SessionLost(SessionError):
    status, code = 410, "session_lost"


class InfraFault(SessionError):
    status, code = 503, "infra_error"


class Unavailable(SessionError):
    status, code = 503, "unavailable"


@dataclass
class Session:
    id: str
    tenant: str
    task_set: TaskSetInfo
    served: ServedTask
    seed: int
    env: RolloutEnv
    first_observation: Observation
    started_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    charged_until: float = field(default_factory=time.monotonic)
    verifies: int = 0
    sandbox_seconds: float = 0.0
    result: dict[str, Any] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closing: bool = False

    @property
    def task(self):
        return self.served.task

    def state(self) -> dict[str, Any]:
        env = self.env
        return {
            "session_id": self.id,
            "task_id": self.task.id,
            "content_hash": self.task.content_hash,
            "task_set_version": self.task_set.version,
            "seed": self.seed,
            "done": env.done,
            "turn": env.turns,
            "max_turns": env.limits.max_turns,
            "end_reason": env.end_reason,
            "result": self.result,
            "idle_s": round(time.monotonic() - self.last_used, 3),
        }


@dataclass(frozen=True)
class Tombstone:
    tenant: str
    reason: str
    until: float


def new_boot_id(replica: str = "") -> str:
    """A fresh boot id: 8 hex digits, after `<replica>.` for a replica of a set (session ids start with it)."""
    token = secrets.token_hex(4)
    return f"{replica}.{token}" if replica else token


def _obs(o: Observation) -> dict[str, Any]:
    return {"text": o.text, "exit_code": o.exit_code, "error": o.error}


class SessionManager:
    def __init__(
        self,
        backend: EnvBackend,
        directory: TaskDirectory,
        quotas: QuotaTracker,
        recorder: SessionRecorder,
        metrics: ServiceMetrics,
        config: ServiceConfig,
        boot_id: str | None = None,
    ):
        self.backend, self.directory, self.quotas = backend, directory, quotas
        self.recorder, self.metrics, self.config = recorder, metrics, config
        self.boot_id = boot_id or new_boot_id(config.replica)
        self._sessions: dict[str, Session] = {}
        self._tombstones: dict[str, Tombstone] = {}
        self._starting: dict[str, int] = {}  # sessions being created, per tenant (count against the limit)
        self._closed_counts: dict[str, int] = {}

    # -- lookup ------------------------------------------------------------------------------

    def open_count(self, tenant: str | None = None) -> int:
        if tenant is None:
            return len(self._sessions) + sum(self._starting.values())
        return sum(1 for s in self._sessions.values() if s.tenant == tenant) + self._starting.get(tenant, 0)

    def sessions_of(self, tenant: Tenant) -> list[Session]:
        return [s for s in self._sessions.values() if s.tenant == tenant.name]

    def get(self, tenant: Tenant, session_id: str) -> Session:
        s = self._sessions.get(session_id)
        if s is not None and s.tenant == tenant.name and not s.closing:
            s.last_used = time.monotonic()
            return s
        tomb = self._tombstones.get(session_id)
        if tomb is not None and tomb.tenant == tenant.name:
            raise SessionLost(f"session {session_id} is gone: {tomb.reason}; start a new session")
        boot, sep, _ = session_id.partition("-")
        if sep and len(boot) == len(self.boot_id) and boot != self.boot_id and s is None:
            raise SessionLost(
                f"session {session_id} was lost: the service restarted since it was created "
                f"(now boot {self.boot_id}); its sandbox is gone, start a new session"
            )
        raise SessionNotFound(f"no session {session_id}")

    # -- lifecycle ---------------------------------------------------------------------------

    async def create(
        self,
        tenant: Tenant,
        task_id: str | None,
        task_set: str | None,
        index: int | None,
        content_hash: str | None,
        seed: int,
        max_turns: int | None,
    ) -> tuple[Session, dict[str, Any]]:
        info, served = await asyncio.to_thread(
            self.directory.resolve_task, tenant, task_id, task_set, index, content_hash
        )
        if self.open_count() >= self.config.max_sessions_total:
            raise Unavailable(
                f"the service has {self.open_count()} sessions open, its limit is "
                f"{self.config.max_sessions_total}; retry shortly"
            )
        self.quotas.check_sandbox_time(tenant, self._live_seconds(tenant.name))
        session_id = f"{self.boot_id}-{secrets.token_urlsafe(12)}"
        self.quotas.open_session(tenant, session_id)  # the tenant's place, counted on every replica
        self._starting[tenant.name] = self._starting.get(tenant.name, 0) + 1
        started = False
        try:
            try:
                image = await self.backend.image_for(served.task)
            except InfraError as exc:
                self.metrics.infra_errors.inc()
                raise InfraFault(f"no image for {served.task.id}: {exc}; retry") from None
            except EnvforgeError as exc:
                raise Unavailable(f"task {served.task.id} cannot be served: {exc}") from None
            limits = EnvLimits.for_task(served.task, min(max_turns, served.task.spec.max_turns) if max_turns else None)
            env = self.backend.make_env(served.task, image)
            env.limits = limits
            try:
                first = await env.reset()
            except InfraError as exc:
                await env.close()
                self.metrics.infra_errors.inc()
                raise InfraFault(f"could not start a sandbox for {served.task.id}: {exc}; retry") from None
            started = True
        finally:
            self._starting[tenant.name] -= 1
            if not started:
                self.quotas.close_session(session_id)
        session = Session(session_id, tenant.name, info, served, seed, env, first)
        self._sessions[session.id] = session
        self.metrics.sessions_started.labels(tenant.name).inc()
        self.metrics.sessions_open.labels(tenant.name).inc()
        out = {
            **session.state(),
            "observation": _obs(first),
            "system_prompt": SYSTEM_PROMPT,
            "tools": TOOLS,
            "idle_timeout_s": self.config.idle_timeout_s,
        }
        for k in ("end_reason", "result", "idle_s"):
            out.pop(k)
        return session, out

    async def step(
        self, tenant: Tenant, session_id: str, tool_call: dict[str, Any] | None, text: str | None
    ) -> dict[str, Any]:
        session = self.get(tenant, session_id)
        async with session.lock:
            if session.env.done:
                raise SessionError(
                    f"session {session_id} has ended ({session.env.end_reason}); its result is in "
                    "GET /sessions/{id} and POST /sessions/{id}/verify"
                )
            self.quotas.take_step(tenant)
            self._charge(session)
            self.quotas.check_sandbox_time(tenant, self._live_seconds(tenant.name))
            try:
                action: Any = parse_tool_call(tool_call) if tool_call is not None else parse_text(text or "")
            except ActionError as exc:
                action = exc
            started = time.perf_counter()
            try:
                obs, done, info = await session.env.step(action)
            except InfraError as exc:
                await self._lose(session, f"infrastructure fault during a step ({exc})")
                raise InfraFault(
                    f"session {session_id} was lost to an infrastructure fault ({exc}); "
                    "start a new session (this is not a model failure)"
                ) from None
            self.metrics.step_seconds.observe(time.perf_counter() - started)
            self.metrics.steps.labels(tenant.name).inc()
            out = {
                "observation": _obs(obs),
                "done": done,
                "turn": session.env.turns,
                "end_reason": info.get("end_reason"),
                "result": None,
            }
            if done:
                out["result"] = await self._grade(session)
                await self._release_sandbox(session)
            session.last_used = time.monotonic()
            return out

    async def verify(self, tenant: Tenant, session_id: str) -> dict[str, Any]:
        session = self.get(tenant, session_id)
        async with session.lock:
            if session.env.done and session.result is not None:
                return {"result": session.result, "done": True}
            self.quotas.take_step(tenant)
            result = await self._grade(session)
            session.last_used = time.monotonic()
            return {"result": result, "done": session.env.done}

    async def delete(self, tenant: Tenant, session_id: str) -> dict[str, Any]:
        session = self.get(tenant, session_id)
        async with session.lock:
            await self._close(session, session.env.end_reason if session.env.done else "deleted")
        self._tombstones.pop(session_id, None)
        return {
            "session_id": session_id,
            "turns": session.env.turns,
            "reward": session.result["reward"] if session.result else None,
        }

    # -- internals ---------------------------------------------------------------------------

    async def _grade(self, session: Session) -> dict[str, Any]:
        started = time.perf_counter()
        self._charge(session)  # a final grade gives the sandbox back first: charge its time up to now
        try:
            _, result = await session.env.verify(keep_sandbox=not session.env.done)  # mid-episode: it goes on
        except InfraError as exc:
            await self._lose(session, f"infrastructure fault while grading ({exc})")
            raise InfraFault(
                f"session {session.id} could not be graded: infrastructure fault ({exc}); start a "
                "new session (this is not a model failure)"
            ) from None
        self.metrics.verify_seconds.observe(time.perf_counter() - started)
        session.verifies += 1
        doc = result.as_json()
        if session.env.done:
            session.result = doc
            self.metrics.rewards.observe(float(result.reward))
        return doc

    async def _release_sandbox(self, session: Session) -> None:
        self._charge(session)
        await session.env.close()

    def _charge(self, session: Session) -> None:
        if session.env.sandbox is None:
            return
        now = time.monotonic()
        self.quotas.charge(session.tenant, now - session.charged_until)
        session.sandbox_seconds += now - session.charged_until
        session.charged_until = now

    def _live_seconds(self, tenant: str) -> float:
        now = time.monotonic()
        return sum(
            now - s.charged_until for s in self._sessions.values() if s.tenant == tenant and s.env.sandbox is not None
        )

    async def _close(self, session: Session, end_reason: str, tombstone: str | None = None) -> None:
        if session.closing:
            return
        session.closing = True
        self._charge(session)
        try:
            await session.env.close()
        except Exception as exc:  # the pool destroys what it cannot reset; never fail a close
            log.warning("closing session %s: %s", session.id, exc)
        self._sessions.pop(session.id, None)
        self.quotas.close_session(session.id)
        if tombstone:
            self._tombstones[session.id] = Tombstone(
                session.tenant, tombstone, time.monotonic() + self.config.tombstone_s
            )
        self._closed_counts[session.tenant] = self._closed_counts.get(session.tenant, 0) + 1
        self.metrics.sessions_open.labels(session.tenant).dec()
        self.metrics.sessions_ended.labels(session.tenant, end_reason).inc()
        record = SessionRecord(
            session_id=session.id,
            tenant=session.tenant,
            task_id=session.task.id,
            content_hash=session.task.content_hash,
            task_set_version=session.task_set.version,
            seed=session.seed,
            turns=session.env.turns,
            verifies=session.verifies,
            reward=float(session.result["reward"]) if session.result else None,
            resolved=bool(session.result["resolved"]) if session.result else None,
            end_reason=end_reason,
            sandbox_seconds=session.sandbox_seconds,
            started_at=session.started_at,
            ended_at=time.time(),
        )
        if self.recorder.add(record):
            asyncio.get_running_loop().run_in_executor(None, self.recorder.flush)

    async def _lose(self, session: Session, reason: str) -> None:
        self.metrics.infra_errors.inc()
        await self._close(session, "lost", tombstone=reason)

    async def reap(self) -> int:
        """Close sessions idle past the timeout, charge sandbox time, flush accounting; returns how many."""
        now = time.monotonic()
        idle = [
            s
            for s in list(self._sessions.values())
            if now - s.last_used > self.config.idle_timeout_s and not s.lock.locked()
        ]
        for s in idle:
            async with s.lock:
                await self._close(
                    s, "idle_timeout", tombstone=f"reaped after {self.config.idle_timeout_s:.0f} s without a request"
                )
        for s in list(self._sessions.values()):
            self._charge(s)
        self._tombstones = {k: t for k, t in self._tombstones.items() if t.until > now}
        closed, self._closed_counts = self._closed_counts, {}
        await asyncio.to_thread(self.quotas.flush, closed)
        await asyncio.to_thread(self.quotas.shared.heartbeat, [(s.id, s.tenant) for s in self._sessions.values()])
        if self.quotas.shared.take_peers_lost():  # a replica died: its sandboxes have no owner now
            removed = await asyncio.to_thread(self.backend.reap_orphans)
            log.warning("a replica of the service died; removed %d of its sandboxes", removed)
        if self.recorder.due():
            await asyncio.to_thread(self.recorder.flush)
        return len(idle)

    async def shutdown(self) -> None:
        for s in list(self._sessions.values()):
            await self._close(s, "shutdown")
        closed, self._closed_counts = self._closed_counts, {}
        await asyncio.to_thread(self.quotas.flush, closed)
        await asyncio.to_thread(self.quotas.shared.retire)
        await asyncio.to_thread(self.recorder.flush)
