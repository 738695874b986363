"""The main job on the bundled examples: ingest -> decontaminate/dedup -> images -> gate -> task set.

Later stages (decontamination, validation, rollouts, training) join here as they land.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from envforge import stages, track
from envforge.config import Settings
from envforge.errors import Problem
from envforge.pipeline import Progress, _no_progress
from envforge.quality.params import DedupConfig
from envforge.verify.gate import GateConfig


@dataclass
class DemoSummary:
    tasks_ingested: int
    rejects: list[Problem]
    images: dict[str, tuple[str, bool]]  # task id -> (tag, cache hit)
    base_image: str
    results: list[dict]
    verified: list[str]
    task_set_version: str | None
    task_set_parquet: Path | None
    mlflow_run_id: str
    chart: Path | None
    problems: list[Problem] = field(default_factory=list)
    removed: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and len(self.verified) + len(self.removed) == self.tasks_ingested


def run_demo(settings: Settings, source_paths: list[Path] | None = None, concurrency: int = 2,
             progress: Progress = _no_progress, dagster_run_id: str | None = None,
             gate: GateConfig = GateConfig(), dedup: DedupConfig = DedupConfig()) -> DemoSummary:
    settings.ensure_dirs()
    paths = source_paths or settings.bundled_sources()
    with track.mlflow_run(settings, "demo", "demo", {"sources": [str(p) for p in paths]}, dagster_run_id) as parent:
        ingested = stages.ingest(settings, paths, nested=True, dagster_run_id=dagster_run_id)
        progress("quality", "decontamination and dedup (first run indexes HumanEval)", 0, 1)
        quality, _, _ = stages.decontaminate(settings, ingested.result.tasks, dedup, nested=True,
                                             dagster_run_id=dagster_run_id)
        progress("quality", "done", 1, 1)
        tasks = [t for t in ingested.result.tasks if t.id in quality.kept_ids()]
        images, _ = stages.build_images(settings, tasks, nested=True, progress=progress, dagster_run_id=dagster_run_id)
        report, _, chart = stages.validate(settings, tasks, images.image_for(), gate, nested=True,
                                           concurrency=concurrency, progress=progress, dagster_run_id=dagster_run_id)
        verified = report.accepted(tasks)
        removed = quality.removed() + [{"task_id": r.task_id, "content_hash": r.content_hash, "stage": "quarantined",
                                        "reason": "; ".join(r.disagreements[:3])}
                                       for r in report.reports if not r.accepted]
        version = parquet = None
        if verified:
            version, parquet = stages.create_task_set(
                settings, "bundled-examples", verified, {**gate.as_params(), **dedup.as_params()},
                sources=[str(p) for p in paths], removed=removed)
        track.log_metrics({"tasks_ingested": len(tasks), "tasks_verified": len(verified)})
        return DemoSummary(
            tasks_ingested=len(tasks), rejects=ingested.result.rejects,
            images={t.id: (b.tag, b.cache_hit) for t, b in images.builds}, base_image=images.base.tag,
            results=report.rows(), verified=[t.id for t in verified], task_set_version=version,
            task_set_parquet=parquet, mlflow_run_id=parent.info.run_id, chart=chart,
            problems=images.failures + report.infra_failures, removed=removed,
        )
