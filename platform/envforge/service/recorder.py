"""Every finished session goes to the catalog (`service_sessions`) and, in batches, to MLflow.

One MLflow run per *batch* of finished sessions (every `record_every_sessions` sessions, at
least every `record_every_s`, and at shutdown): a run per session would bury the experiment
in tiny runs, and a run per tenant per day would have to stay open across restarts. Each batch
run logs per-tenant counts, mean reward, resolved rate and turns, and the batch's rows as a
parquet artifact; each catalog row carries its batch's run id, so a tenant's day is one query
away (`Catalog.service_sessions(tenant)`). Writes happen off the event loop; a batch that cannot
be written (catalog locked for long) stays buffered and is retried on the next flush.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import polars as pl

from envforge import track
from envforge.catalog import Catalog
from envforge.config import Settings

log = logging.getLogger("envforge.service")


@dataclass
class SessionRecord:
    session_id: str
    tenant: str
    task_id: str
    content_hash: str
    task_set_version: str
    seed: int
    turns: int
    verifies: int
    reward: float | None
    resolved: bool | None
    end_reason: str
    sandbox_seconds: float
    started_at: float
    ended_at: float

    def row(self, mlflow_run_id: str | None) -> dict[str, Any]:
        def ts(t: float) -> datetime:
            return datetime.fromtimestamp(t, timezone.utc).replace(tzinfo=None)

        return {
            **self.__dict__,
            "sandbox_seconds": round(self.sandbox_seconds, 3),
            "started_at": ts(self.started_at),
            "ended_at": ts(self.ended_at),
            "mlflow_run_id": mlflow_run_id,
        }


def batch_metrics(records: list[SessionRecord]) -> dict[str, float]:
    graded = [r for r in records if r.reward is not None]
    metrics = {
        "sessions": float(len(records)),
        "graded_sessions": float(len(graded)),
        "mean_reward": statistics.fmean(r.reward for r in graded) if graded else 0.0,
        "resolved_rate": sum(1 for r in graded if r.resolved) / len(graded) if graded else 0.0,
        "mean_turns": statistics.fmean(r.turns for r in records) if records else 0.0,
        "sandbox_seconds": sum(r.sandbox_seconds for r in records),
    }
    for tenant, n in Counter(r.tenant for r in records).items():
        metrics[f"sessions.{tenant}"] = float(n)
    for reason, n in Counter(r.end_reason for r in records).items():
        metrics[f"ended.{reason}"] = float(n)
    return metrics


class SessionRecorder:
    def __init__(
        self,
        settings: Settings,
        every_sessions: int = 100,
        every_s: float = 300.0,
        boot_id: str = "",
        mlflow: bool = True,
    ):
        self.settings = settings
        self.mlflow = mlflow
        self.every_sessions = every_sessions
        self.every_s = every_s
        self.boot_id = boot_id
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._pending: list[SessionRecord] = []
        self._oldest = 0.0
        self.batches_written = 0

    def add(self, record: SessionRecord) -> bool:
        """Buffer a finished session; True when a batch is due."""
        with self._lock:
            if not self._pending:
                self._oldest = time.monotonic()
            self._pending.append(record)
            return len(self._pending) >= self.every_sessions

    def due(self) -> bool:
        with self._lock:
            return bool(self._pending) and time.monotonic() - self._oldest >= self.every_s

    def _log_batch(self, batch: list[SessionRecord]) -> str | None:
        """One MLflow run for the batch; None when MLflow is off or unreachable (the catalog still gets it)."""
        if not self.mlflow:
            return None
        tenants = sorted({r.tenant for r in batch})
        try:
            with track.mlflow_run(
                self.settings,
                "service-sessions",
                "service",
                {"boot_id": self.boot_id, "sessions": len(batch), "tenants": tenants},
                tags={"envforge.service.tenants": ",".join(tenants)[:4000]},
            ) as run:
                track.log_metrics(batch_metrics(batch))
                track.log_frame(pl.DataFrame([r.row(None) for r in batch]), "sessions/sessions.parquet")
                return run.info.run_id
        except Exception as exc:  # MLflow down must not lose the catalog record
            log.warning("could not log the session batch to MLflow: %s", exc)
            return None

    def flush(self) -> str | None:
        """Write the buffered sessions as one batch; returns the MLflow run id (None if nothing to write)."""
        with self._flush_lock:
            with self._lock:
                batch, self._pending = self._pending, []
            if not batch:
                return None
            run_id = self._log_batch(batch)
            try:
                Catalog(self.settings.catalog_path).record_service_sessions([r.row(run_id) for r in batch])
            except Exception as exc:
                log.warning(
                    "could not write %d session records to the catalog (kept for the next flush): %s", len(batch), exc
                )
                with self._lock:
                    self._pending = batch + self._pending
                return run_id
            self.batches_written += 1
            return run_id
