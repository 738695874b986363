"""The per-tenant counters every replica of the service shares: open sessions and the step rate.

One service process could keep these in memory; several replicas behind a proxy cannot, or a
tenant limited to 8 sessions would get 8 per replica. They live in the tenants SQLite file (WAL
mode; `tenants.py` says why SQLite and not the DuckDB catalog), and every check-and-count is one
`BEGIN IMMEDIATE` transaction, so two replicas admitting the same tenant's last session at once
cannot both win. `synchronous=NORMAL` on this connection: a power cut may forget the last few
counts (rate counters), never corrupts the file, and a step does not wait for an fsync.

- Open sessions: one lease row per session, written before its sandbox starts and deleted when it
  closes. A lease belongs to its replica (boot id); a replica that stops heart-beating for `ttl_s`,
  or whose process is gone (same host: checked by pid, at once), is dead: its leases are deleted by
  the next replica that counts, so a killed replica leaks no quota. A replica found dead while it
  was only stalled re-registers and re-asserts its sessions' leases at its next heartbeat.
- Steps per minute: a count per tenant per wall-clock second; the window is the last 60 of them,
  so a step leaves it up to a second early (never late).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from pathlib import Path
from typing import Iterable, Iterator

from envforge.sandbox.engine import owner_alive, owner_id

WINDOW_S = 60.0

_DDL = """
CREATE TABLE IF NOT EXISTS replicas (
    boot_id TEXT PRIMARY KEY, owner TEXT NOT NULL, heartbeat REAL NOT NULL, url TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS session_leases (
    session_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, boot_id TEXT NOT NULL, created_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS session_leases_tenant ON session_leases (tenant);
CREATE TABLE IF NOT EXISTS step_seconds (
    tenant TEXT NOT NULL, second INTEGER NOT NULL, steps INTEGER NOT NULL, PRIMARY KEY (tenant, second));
"""


class SharedQuotaState:
    """This replica's handle on the shared counters (one connection, serialized by a lock)."""

    def __init__(self, path: Path, boot_id: str, ttl_s: float = 30.0, owner: str | None = None, url: str = ""):
        """`url`: where peers reach this replica (a replica set's member lists its tenants' sessions
        there for the others); empty for a process of its own."""
        self.boot_id, self.ttl_s, self.owner, self.url = boot_id, ttl_s, owner or owner_id(), url
        self._lock = threading.Lock()
        self._con = sqlite3.connect(str(path), check_same_thread=False, timeout=30, isolation_level=None)
        self._con.execute("PRAGMA journal_mode=WAL")
        self._con.execute("PRAGMA synchronous=NORMAL")
        self._con.execute("PRAGMA busy_timeout=30000")
        self._con.executescript(_DDL)
        self.peers_lost = 0  # dead replicas whose leases this one freed (their sandboxes are orphans now)
        self.heartbeat([])

    def close(self) -> None:
        with self._lock:
            self._con.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taking the file's write lock first (no upgrade deadlocks)."""
        with self._lock:
            self._con.execute("BEGIN IMMEDIATE")
            try:
                yield self._con
            except BaseException:
                self._con.execute("ROLLBACK")
                raise
            self._con.execute("COMMIT")

    def _free_dead(self, con: sqlite3.Connection, now: float) -> None:
        rows = con.execute("SELECT boot_id, owner, heartbeat FROM replicas WHERE boot_id != ?", (self.boot_id,))
        dead = [b for b, owner, beat in rows.fetchall() if beat < now - self.ttl_s or not owner_alive(owner)]
        for boot in dead:
            con.execute("DELETE FROM replicas WHERE boot_id = ?", (boot,))
        # Leases of replicas without a row: the dead ones just found, and any a replica took after a
        # peer had declared it dead (its next heartbeat re-asserts those of its sessions).
        con.execute("DELETE FROM session_leases WHERE boot_id NOT IN (SELECT boot_id FROM replicas)")
        self.peers_lost += len(dead)

    def open_session(self, tenant: str, session_id: str, limit: int, now: float | None = None) -> tuple[bool, int]:
        """Take a lease for a new session when the tenant has fewer than `limit` open on all replicas:
        (taken, sessions the tenant had open)."""
        now = time.time() if now is None else now
        with self._write() as con:
            self._free_dead(con, now)
            (open_now,) = con.execute("SELECT count(*) FROM session_leases WHERE tenant = ?", (tenant,)).fetchone()
            if open_now >= limit:
                return False, open_now
            con.execute("INSERT INTO session_leases VALUES (?, ?, ?, ?)", (session_id, tenant, self.boot_id, now))
            return True, open_now

    def close_session(self, session_id: str) -> None:
        with self._write() as con:
            con.execute("DELETE FROM session_leases WHERE session_id = ?", (session_id,))

    def take_step(self, tenant: str, limit: int, now: float | None = None) -> tuple[bool, int, float]:
        """Count one step when the tenant made fewer than `limit` in the window on all replicas:
        (taken, steps in the window, when the oldest counted one leaves it)."""
        now = time.time() if now is None else now
        with self._write() as con:
            con.execute("DELETE FROM step_seconds WHERE tenant = ? AND second <= ?", (tenant, now - WINDOW_S))
            steps, oldest = con.execute(
                "SELECT coalesce(sum(steps), 0), min(second) FROM step_seconds WHERE tenant = ?", (tenant,)
            ).fetchone()
            if steps >= limit:
                return False, int(steps), float(oldest) + WINDOW_S
            con.execute(
                """INSERT INTO step_seconds VALUES (?, ?, 1)
                   ON CONFLICT (tenant, second) DO UPDATE SET steps = steps + 1""",
                (tenant, int(now)),
            )
            return True, int(steps) + 1, now + WINDOW_S

    def heartbeat(self, sessions: Iterable[tuple[str, str]], now: float | None = None) -> None:
        """Say this replica lives; free dead replicas' leases and old step counts. `sessions`
        (id, tenant) are re-leased only when peers had declared this replica dead."""
        now = time.time() if now is None else now
        with self._write() as con:
            beat = con.execute("UPDATE replicas SET heartbeat = ? WHERE boot_id = ?", (now, self.boot_id))
            if beat.rowcount == 0:
                con.execute("INSERT INTO replicas VALUES (?, ?, ?, ?)", (self.boot_id, self.owner, now, self.url))
                con.executemany(
                    "INSERT OR IGNORE INTO session_leases VALUES (?, ?, ?, ?)",
                    [(sid, tenant, self.boot_id, now) for sid, tenant in sessions],
                )
            self._free_dead(con, now)
            con.execute("DELETE FROM step_seconds WHERE second <= ?", (now - WINDOW_S,))

    def peers_serving(self, tenant: str) -> list[str]:
        """The URLs of the other live replicas that hold sessions of `tenant`."""
        with self._lock:
            rows = self._con.execute(
                """SELECT DISTINCT r.url FROM replicas r JOIN session_leases l USING (boot_id)
                   WHERE l.tenant = ? AND r.boot_id != ? AND r.url != '' AND r.heartbeat >= ?""",
                (tenant, self.boot_id, time.time() - self.ttl_s),
            ).fetchall()
        return sorted(url for (url,) in rows)

    def retire(self) -> None:
        """A graceful stop: this replica's leases and row go (its sessions were closed)."""
        with self._write() as con:
            con.execute("DELETE FROM session_leases WHERE boot_id = ?", (self.boot_id,))
            con.execute("DELETE FROM replicas WHERE boot_id = ?", (self.boot_id,))

    def take_peers_lost(self) -> int:
        with self._lock:
            lost, self.peers_lost = self.peers_lost, 0
            return lost
