"""Per-tenant quotas: sessions open at once, steps per minute, sandbox-seconds per UTC day.

A request over a quota gets 429 with `Retry-After`: for the step rate, when the oldest step of
the window leaves it; for sandbox time, at the next UTC midnight; for open sessions, a short
back-off (a session closes when its client deletes it or it idles out). Open sessions and steps
are counted in the store every replica of the service shares (`shared_quotas`: a lease per open
session, a count per second of the last 60), so a limit holds for the tenant however many replicas
serve it. Sandbox time is charged from each session's open time, kept in memory between flushes
and written to the tenants file by the reaper tick and when a session closes; a check reads the
file's figure (every replica's flushed time) plus this replica's unflushed and live time, so a
restart loses at most one tick of accounting and replicas see each other's time within a tick.
"""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections import defaultdict
from datetime import datetime, timedelta, timezone

from envforge.errors import EnvforgeError
from envforge.service.shared_quotas import SharedQuotaState
from envforge.service.tenants import Tenant, TenantStore, utc_day

SESSION_RETRY_AFTER_S = 5


class QuotaExceeded(EnvforgeError):
    def __init__(self, quota: str, message: str, retry_after_s: float):
        super().__init__(message)
        self.quota = quota
        self.retry_after_s = max(1, math.ceil(retry_after_s))


def seconds_to_utc_midnight(now: float | None = None) -> float:
    now_dt = datetime.fromtimestamp(time.time() if now is None else now, timezone.utc)
    midnight = (now_dt + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return (midnight - now_dt).total_seconds()


class QuotaTracker:
    """One replica's quotas: `shared` holds the counters all replicas share (a private boot id
    when none is given: a process of its own)."""

    def __init__(self, store: TenantStore, shared: SharedQuotaState | None = None):
        self.store = store
        self.shared = shared or SharedQuotaState(store.path, secrets.token_hex(4))
        self._lock = threading.Lock()
        self._day = utc_day()
        self._unflushed: dict[str, float] = defaultdict(float)  # charged here, not yet in the store

    def _roll_day(self) -> None:
        today = utc_day()
        if today != self._day:
            self._day = today

    def close(self) -> None:
        self.shared.close()

    def check_sessions(self, tenant: Tenant, open_now: int) -> None:
        if open_now >= tenant.limits.max_sessions:
            raise QuotaExceeded(
                "sessions",
                f"tenant {tenant.name} has {open_now} sessions open, its limit is "
                f"{tenant.limits.max_sessions}: delete finished sessions",
                SESSION_RETRY_AFTER_S,
            )

    def open_session(self, tenant: Tenant, session_id: str) -> None:
        """Lease a place for a new session under the tenant's limit (on all replicas), or raise."""
        taken, open_now = self.shared.open_session(tenant.name, session_id, tenant.limits.max_sessions)
        if not taken:
            self.check_sessions(tenant, open_now)

    def close_session(self, session_id: str) -> None:
        self.shared.close_session(session_id)

    def take_step(self, tenant: Tenant, now: float | None = None) -> None:
        """Count one step (or verify) against the tenant's rate, or raise when the window is full.
        `now` is wall-clock time: replicas share the window."""
        now = time.time() if now is None else now
        taken, steps, frees_at = self.shared.take_step(tenant.name, tenant.limits.steps_per_minute, now)
        if not taken:
            raise QuotaExceeded(
                "steps_per_minute",
                f"tenant {tenant.name} made {steps} steps in the last minute, its limit is "
                f"{tenant.limits.steps_per_minute}",
                frees_at - now,
            )

    def charge(self, tenant: str, seconds: float) -> None:
        if seconds > 0:
            with self._lock:
                self._roll_day()
                self._unflushed[tenant] += seconds

    def used_today(self, tenant: str, live_s: float = 0.0) -> float:
        """Sandbox-seconds today: every replica's flushed time, this one's unflushed and `live_s`."""
        with self._lock:
            self._roll_day()
            day, unflushed = self._day, self._unflushed.get(tenant, 0.0)
        return self.store.usage(tenant, day) + unflushed + live_s

    def check_sandbox_time(self, tenant: Tenant, live_s: float = 0.0) -> None:
        used = self.used_today(tenant.name, live_s)
        if used >= tenant.limits.sandbox_seconds_per_day:
            raise QuotaExceeded(
                "sandbox_seconds_per_day",
                f"tenant {tenant.name} used {used:.0f} sandbox-seconds "
                f"today (UTC), its limit is {tenant.limits.sandbox_seconds_per_day:.0f}",
                seconds_to_utc_midnight(),
            )

    def flush(self, sessions_closed: dict[str, int] | None = None) -> None:
        """Write the charged seconds (and closed-session counts) to the tenants file."""
        with self._lock:
            pending, self._unflushed = dict(self._unflushed), defaultdict(float)
            day = self._day
        closed = sessions_closed or {}
        for tenant in set(pending) | set(closed):
            self.store.add_usage(tenant, pending.get(tenant, 0.0), closed.get(tenant, 0), day)
