"""What was found out about each task version: flakiness-gate verdicts with their verifier strength,
decontamination and dedup verdicts, the task images built and the graded runs; and the task
selections the verdicts make (clean, accepted, audit only).

Gate reports, image builds and verification results come in as anything with the fields stored
(`verify.gate.GateReport`, `sandbox.images.ImageBuild`, `verify.result.VerificationResult`), so
the catalog does not depend on the packages that produce them.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Iterable, Protocol, Sequence

import polars as pl

from envforge.catalog.base import frame, now
from envforge.catalog.tasks import TaskStore
from envforge.task import Task


class ImageBuilt(Protocol):
    """One task image made sure of (`sandbox.images.ImageBuild`)."""

    @property
    def tag(self) -> str: ...

    @property
    def cache_hit(self) -> bool: ...

    @property
    def seconds(self) -> float: ...

    @property
    def size_mb(self) -> float | None: ...


class GradedRun(Protocol):
    """One graded solution (`verify.result.VerificationResult`); checkpoints are stored as their fields."""

    @property
    def solution(self) -> str: ...

    @property
    def reward(self) -> float: ...

    @property
    def resolved(self) -> bool: ...

    @property
    def reasons(self) -> Sequence[str]: ...

    @property
    def tests(self) -> dict[str, str]: ...

    @property
    def checkpoints(self) -> Sequence[Any]: ...

    @property
    def patch_method(self) -> str | None: ...

    @property
    def duration_s(self) -> float: ...

    @property
    def image(self) -> str: ...


class VerdictStore(TaskStore):
    """The `validations`, `quality`, `images` and `runs` tables."""

    def record_images(self, builds: Iterable[tuple[Task, ImageBuilt]]) -> None:
        at = now()
        self.write(
            {
                "images": frame(
                    "images",
                    [
                        {
                            "task_id": t.id,
                            "content_hash": t.content_hash,
                            "image": b.tag,
                            "cache_hit": b.cache_hit,
                            "seconds": float(b.seconds),
                            "size_mb": b.size_mb,
                            "built_at": at,
                        }
                        for t, b in builds
                    ],
                )
            }
        )

    def latest_images(self) -> dict[str, str]:
        """content_hash -> image tag of the most recent build."""
        found = self.query("SELECT content_hash, arg_max(image, built_at) AS image FROM images GROUP BY 1")
        return dict(zip(found["content_hash"], found["image"]))

    def record_runs(
        self,
        results: Iterable[tuple[Task, GradedRun]],
        mlflow_run_id: str | None = None,
        dagster_run_id: str | None = None,
    ) -> list[str]:
        at = now()
        rows = []
        for task, r in results:
            rows.append(
                {
                    "run_id": uuid.uuid4().hex,
                    "task_id": task.id,
                    "content_hash": task.content_hash,
                    "solution": r.solution,
                    "reward": float(r.reward),
                    "resolved": r.resolved,
                    "reasons": list(r.reasons),
                    "tests_json": json.dumps(r.tests, sort_keys=True),
                    "checkpoints_json": json.dumps([c.__dict__ for c in r.checkpoints]),
                    "patch_method": r.patch_method,
                    "duration_s": float(r.duration_s),
                    "image": r.image,
                    "mlflow_run_id": mlflow_run_id,
                    "dagster_run_id": dagster_run_id,
                    "created_at": at,
                }
            )
        self.write({"runs": frame("runs", rows)})
        return [r["run_id"] for r in rows]

    def runs(self) -> pl.DataFrame:
        return self.query("SELECT * FROM runs ORDER BY created_at, task_id, solution")

    def record_validations(
        self, reports: Iterable, params: dict, mlflow_run_id: str | None = None, dagster_run_id: str | None = None
    ) -> None:
        """Store flakiness-gate verdicts (envforge.verify.gate.GateReport)."""
        at = now()
        params_json = json.dumps(params, sort_keys=True)
        self.write(
            {
                "validations": frame(
                    "validations",
                    [
                        {
                            "content_hash": r.content_hash,
                            "task_id": r.task_id,
                            "verdict": r.verdict,
                            "disagreements": list(r.disagreements),
                            "runs": r.runs,
                            "reference_passes": r.reference_passes,
                            "empty_fails": r.empty_fails,
                            "probes_json": json.dumps(r.probe_results, sort_keys=True),
                            "verifier_median_s": float(r.median_verifier_s),
                            "infra_retries": r.infra_retries,
                            "params_json": params_json,
                            "mlflow_run_id": mlflow_run_id,
                            "dagster_run_id": dagster_run_id,
                            "created_at": at,
                            "image_digest": r.image_digest or None,
                            "gate_key": r.gate_key or None,
                            "stats_json": json.dumps(r.stats(), sort_keys=True),
                            "strength": r.strength_score,
                            "admission": r.admission or None,
                        }
                        for r in reports
                    ],
                )
            }
        )

    def validations_by_key(self, keys: Iterable[str]) -> dict[str, dict]:
        """The newest verdict row stored under each of the given gate keys (see verify.gate.gate_key)."""
        keys = sorted(set(keys))
        if not keys:
            return {}
        found = self.query(
            """
            SELECT * EXCLUDE (rn) FROM (
                SELECT *, row_number() OVER (PARTITION BY gate_key ORDER BY created_at DESC) AS rn
                FROM validations WHERE gate_key IN (SELECT unnest(?::VARCHAR[]))) WHERE rn = 1""",
            [keys],
        )
        return {row["gate_key"]: row for row in found.to_dicts()}

    def _latest_per_current_task(self, table: str) -> pl.DataFrame:
        """The newest row of `table` for each current task version."""
        return self.query(f"""
            SELECT x.* EXCLUDE (rn) FROM (
                SELECT *, row_number() OVER (PARTITION BY content_hash ORDER BY created_at DESC) AS rn
                FROM {table}) x JOIN current_tasks t USING (content_hash)
            WHERE rn = 1 ORDER BY x.task_id""")

    def latest_validations(self) -> pl.DataFrame:
        """The most recent verdict per current task version."""
        return self._latest_per_current_task("validations")

    def audit_only(self, content_hashes: Iterable[str]) -> set[str]:
        """The given task versions whose latest gate verdict admits them to the audit split only (a weak
        verifier gated with below_strength=audit): never train or eval."""
        hashes = sorted(set(content_hashes))
        if not hashes:
            return set()
        found = self.query(
            """
            SELECT content_hash, arg_max(coalesce(admission, ''), created_at) AS admission FROM validations
            WHERE content_hash IN (SELECT unnest(?::VARCHAR[])) GROUP BY content_hash""",
            [hashes],
        )
        return {row["content_hash"] for row in found.to_dicts() if row["admission"] == "audit"}

    def record_quality(self, rows: list[dict], params: dict) -> None:
        """Store decontamination/dedup verdicts (dicts with the QualityRow fields but params/created_at)."""
        at = now()
        params_json = json.dumps(params, sort_keys=True)
        self.write({"quality": frame("quality", [dict(r, params_json=params_json, created_at=at) for r in rows])})

    def latest_quality(self) -> pl.DataFrame:
        """The most recent quality verdict per current task version."""
        return self._latest_per_current_task("quality")

    def clean_tasks(self) -> list[Task]:
        """Current tasks that are neither contaminated nor a removed duplicate (unchecked ones count as clean)."""
        removed = set(self.latest_quality().filter(pl.col("status") != "clean")["content_hash"])
        return [t for t in self.load_tasks() if t.content_hash not in removed]

    def accepted_tasks(self) -> list[Task]:
        """Clean current tasks whose latest gate verdict is `accepted`: what a task set may hold."""
        latest = self.latest_validations()
        ok = set(latest.filter(pl.col("verdict") == "accepted")["content_hash"])
        return [t for t in self.clean_tasks() if t.content_hash in ok]
