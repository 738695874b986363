"""Finished sessions of the environment service (`envforge.service`), for accounting per tenant."""

from __future__ import annotations

import polars as pl

from envforge.catalog.base import CatalogBase, frame


class SessionStore(CatalogBase):
    """The `service_sessions` table."""

    def record_service_sessions(self, rows: list[dict]) -> None:
        """Store finished environment-service sessions (rows of ServiceSessionRow), all or none."""
        self.write({"service_sessions": frame("service_sessions", rows)})

    def service_sessions(self, tenant: str | None = None) -> pl.DataFrame:
        if tenant is None:
            return self.query("SELECT * FROM service_sessions ORDER BY ended_at")
        return self.query("SELECT * FROM service_sessions WHERE tenant = ? ORDER BY ended_at", [tenant])
