"""Tenants, their API keys and their daily usage, in one SQLite file beside the catalog.

Why SQLite and not the DuckDB catalog: the service checks a key on every request and adds
usage as sessions run, while `envforge service keys ...` and the pipeline write from other
processes. DuckDB allows one writing process at a time; SQLite in WAL mode lets the CLI revoke
a key while the server runs, and the server sees it on the next request (no cache to expire).

Keys look like `efk_<key id>_<secret>`. Only the SHA-256 of the secret is stored; the key id
finds the row and the hash is compared in constant time. The secret is 32 random bytes, so a
fast hash is enough (a slow KDF protects guessable passwords, not random keys). A key is shown
once, when it is created.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from envforge.config import Settings
from envforge.errors import EnvforgeError, InvalidValue
from envforge.service.config import TenantLimits

KEY_PREFIX = "efk"
_KEY = re.compile(r"^efk_(?P<id>[0-9a-f]{12})_(?P<secret>[A-Za-z0-9_-]{43})$")
_TENANT = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
ALL_TASK_SETS = "*"

_DDL = """
CREATE TABLE IF NOT EXISTS tenants (
    name TEXT PRIMARY KEY, task_sets TEXT NOT NULL, limits TEXT NOT NULL, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS api_keys (
    key_id TEXT PRIMARY KEY, tenant TEXT NOT NULL REFERENCES tenants(name), secret_sha256 TEXT NOT NULL,
    label TEXT NOT NULL, created_at REAL NOT NULL, revoked_at REAL);
CREATE TABLE IF NOT EXISTS usage (
    tenant TEXT NOT NULL, day TEXT NOT NULL, sandbox_seconds REAL NOT NULL, sessions INTEGER NOT NULL,
    PRIMARY KEY (tenant, day));
"""


@dataclass(frozen=True)
class Tenant:
    name: str
    task_sets: tuple[str, ...]  # task-set names (or full versions) the tenant may use; "*" for all
    limits: TenantLimits

    def may_use(self, name: str, version: str) -> bool:
        return any(s in (ALL_TASK_SETS, name, version) for s in self.task_sets)


@dataclass(frozen=True)
class KeyInfo:
    key_id: str
    tenant: str
    label: str
    created_at: float
    revoked_at: float | None

    def as_json(self) -> dict[str, Any]:
        return {
            "key_id": self.key_id,
            "tenant": self.tenant,
            "label": self.label,
            "created_at": _iso(self.created_at),
            "revoked_at": _iso(self.revoked_at) if self.revoked_at else None,
        }


def tenants_path(settings: Settings) -> Path:
    return settings.data_dir / "service" / "tenants.sqlite"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds")


def utc_day(ts: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if ts is None else ts, timezone.utc).strftime("%Y-%m-%d")


def _sha256(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class TenantStore:
    """Thread-safe handle on the tenants file (one connection per process, serialized)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._con = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30, isolation_level=None)
        self._con.execute("PRAGMA journal_mode=WAL")
        self._con.execute("PRAGMA busy_timeout=30000")
        self._con.executescript(_DDL)

    def close(self) -> None:
        with self._lock:
            self._con.close()

    def _rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._con.execute(sql, params).fetchall()

    def _exec(self, sql: str, params: tuple = ()) -> int:
        with self._lock:
            return self._con.execute(sql, params).rowcount

    # -- tenants -----------------------------------------------------------------------------

    def upsert_tenant(
        self, name: str, task_sets: list[str] | None = None, limits: TenantLimits | None = None
    ) -> Tenant:
        """Create the tenant, or change the scopes/limits given (others stay as they were)."""
        if not _TENANT.match(name):
            raise InvalidValue(f"tenant {name!r}: use 1-63 of a-z, 0-9, '.', '_', '-' (starting alphanumeric)")
        for s in task_sets or []:
            if not s.strip():
                raise InvalidValue(f"tenant {name!r}: an empty task-set scope (use '*' for every task set)")
        existing = self.tenant(name)
        if existing is None:
            tenant = Tenant(name, tuple(task_sets or [ALL_TASK_SETS]), limits or TenantLimits())
            self._exec(
                "INSERT INTO tenants VALUES (?, ?, ?, ?)",
                (name, json.dumps(list(tenant.task_sets)), json.dumps(tenant.limits.as_json()), time.time()),
            )
            return tenant
        tenant = Tenant(name, tuple(task_sets) if task_sets else existing.task_sets, limits or existing.limits)
        self._exec(
            "UPDATE tenants SET task_sets = ?, limits = ? WHERE name = ?",
            (json.dumps(list(tenant.task_sets)), json.dumps(tenant.limits.as_json()), name),
        )
        return tenant

    def tenant(self, name: str) -> Tenant | None:
        rows = self._rows("SELECT name, task_sets, limits FROM tenants WHERE name = ?", (name,))
        if not rows:
            return None
        n, scopes, limits = rows[0]
        return Tenant(n, tuple(json.loads(scopes)), TenantLimits(**json.loads(limits)))

    def tenants(self) -> list[Tenant]:
        return [t for (n,) in self._rows("SELECT name FROM tenants ORDER BY name") if (t := self.tenant(n))]

    # -- keys --------------------------------------------------------------------------------

    def create_key(self, tenant: str, label: str = "") -> tuple[str, KeyInfo]:
        """A new key for an existing tenant: (the key, shown once; its record)."""
        if self.tenant(tenant) is None:
            raise EnvforgeError(f"no tenant {tenant!r}")
        key_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
        now = time.time()
        self._exec("INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, NULL)", (key_id, tenant, _sha256(secret), label, now))
        return f"{KEY_PREFIX}_{key_id}_{secret}", KeyInfo(key_id, tenant, label, now, None)

    def keys(self, tenant: str | None = None) -> list[KeyInfo]:
        sql = "SELECT key_id, tenant, label, created_at, revoked_at FROM api_keys"
        rows = self._rows(
            sql + (" WHERE tenant = ?" if tenant else "") + " ORDER BY created_at", (tenant,) if tenant else ()
        )
        return [KeyInfo(*r) for r in rows]

    def revoke(self, key_id: str) -> bool:
        """Revoke a key by id (or by the whole key); False when there is no such active key."""
        m = _KEY.match(key_id)
        key_id = m.group("id") if m else key_id
        return (
            self._exec(
                "UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL", (time.time(), key_id)
            )
            > 0
        )

    def authenticate(self, key: str) -> Tenant | None:
        """The tenant an active key belongs to; None for a malformed, unknown or revoked key."""
        m = _KEY.match(key or "")
        if m is None:
            return None
        rows = self._rows(
            "SELECT tenant, secret_sha256 FROM api_keys WHERE key_id = ? AND revoked_at IS NULL", (m.group("id"),)
        )
        if not rows or not hmac.compare_digest(rows[0][1], _sha256(m.group("secret"))):
            return None
        return self.tenant(rows[0][0])

    # -- usage -------------------------------------------------------------------------------

    def add_usage(self, tenant: str, sandbox_seconds: float, sessions: int = 0, day: str | None = None) -> None:
        self._exec(
            """INSERT INTO usage VALUES (?, ?, ?, ?) ON CONFLICT (tenant, day) DO UPDATE SET
                      sandbox_seconds = sandbox_seconds + excluded.sandbox_seconds,
                      sessions = sessions + excluded.sessions""",
            (tenant, day or utc_day(), float(sandbox_seconds), int(sessions)),
        )

    def usage(self, tenant: str, day: str | None = None) -> float:
        rows = self._rows("SELECT sandbox_seconds FROM usage WHERE tenant = ? AND day = ?", (tenant, day or utc_day()))
        return float(rows[0][0]) if rows else 0.0
