"""Rollout batches: where each batch's trajectories are stored and what it holds.

The trajectories themselves are parquet parts under the batch's location (`rollout.store`,
rows of `schemas.TrajectoryRow`), not a catalog table; the catalog registers the batch.
"""

from __future__ import annotations

import polars as pl

from envforge.catalog.base import CatalogBase, frame, now


class RolloutStore(CatalogBase):
    """The `rollout_batches` table."""

    def record_rollout_batch(self, row: dict) -> None:
        """Register a rollout batch (a row of RolloutBatchRow without created_at); re-registering adds a row."""
        self.write({"rollout_batches": frame("rollout_batches", [dict(row, created_at=now())])})

    def rollout_batches(self) -> pl.DataFrame:
        """The latest registration of every rollout batch."""
        return self.query("""SELECT * EXCLUDE (rn) FROM (SELECT *, row_number() OVER (PARTITION BY batch_id
                             ORDER BY created_at DESC) AS rn FROM rollout_batches) WHERE rn = 1
                             ORDER BY created_at""")
