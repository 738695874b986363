"""Per-tenant quotas: sessions open at once, steps per minute, sandbox-seconds per UTC day.

A request over a quota gets 429 with `Retry-After`: for the step rate, when the oldest step of
the window leaves it; for sandbox time, at the next UTC midnight; for open sessions, a short
back-off (a session closes when its client deletes it or it idles out). Steps are counted in a
sliding 60-second window in memory. Sandbox time is charged from each session's open time, kept
in memory between flushes and written to the tenants file by the reaper tick and when a session
closes, so a restart loses at most one tick of accounting.
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict, deque
from datetime import datetime, timedelta, timezone

from envforge.errors import EnvforgeError
from envforge.service.tenants import Tenant, TenantStore, utc_day

WINDOW_S = 60.0
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
    def __init__(self, store: TenantStore):
        self.store = store
        self._lock = threading.Lock()
        self._steps: dict[str, deque[float]] = defaultdict(deque)
        self._day = utc_day()
        self._unflushed: dict[str, float] = defaultdict(float)  # charged here, not yet in the store
        self._stored: dict[str, float] = {}  # the store's figure for today, read once per tenant per day

    def _roll_day(self) -> None:
        today = utc_day()
        if today != self._day:
            self._day, self._stored = today, {}

    def check_sessions(self, tenant: Tenant, open_now: int) -> None:
        if open_now >= tenant.limits.max_sessions:
            raise QuotaExceeded(
                "sessions",
                f"tenant {tenant.name} has {open_now} sessions open, its limit is "
                f"{tenant.limits.max_sessions}: delete finished sessions",
                SESSION_RETRY_AFTER_S,
            )

    def take_step(self, tenant: Tenant, now: float | None = None) -> None:
        """Count one step (or verify) against the tenant's rate, or raise when the window is full."""
        now = time.monotonic() if now is None else now
        with self._lock:
            window = self._steps[tenant.name]
            while window and window[0] <= now - WINDOW_S:
                window.popleft()
            if len(window) >= tenant.limits.steps_per_minute:
                raise QuotaExceeded(
                    "steps_per_minute",
                    f"tenant {tenant.name} made {len(window)} steps in the "
                    f"last minute, its limit is {tenant.limits.steps_per_minute}",
                    window[0] + WINDOW_S - now,
                )
            window.append(now)

    def charge(self, tenant: str, seconds: float) -> None:
        if seconds > 0:
            with self._lock:
                self._roll_day()
                self._unflushed[tenant] += seconds

    def used_today(self, tenant: str, live_s: float = 0.0) -> float:
        with self._lock:
            self._roll_day()
            known = tenant in self._stored
        if not known:
            stored = self.store.usage(tenant, self._day)
            with self._lock:
                self._stored.setdefault(tenant, stored)
        with self._lock:
            return self._stored[tenant] + self._unflushed.get(tenant, 0.0) + live_s

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
            for tenant, seconds in pending.items():
                if tenant in self._stored:
                    self._stored[tenant] += seconds
        closed = sessions_closed or {}
        for tenant in set(pending) | set(closed):
            self.store.add_usage(tenant, pending.get(tenant, 0.0), closed.get(tenant, 0), day)
