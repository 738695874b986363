"""Pipeline stages wrapped in MLflow runs: what the CLI, the demo and the Dagster assets call.

`pipeline` does the work; this module adds the record of it (params, metrics, tables,
charts) so that every entry point logs the same things the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from envforge import pipeline, track
from envforge.catalog import Catalog, IngestSummary
from envforge.charts import solution_outcomes_chart
from envforge.config import Settings
from envforge.pipeline import ImagesReport, Progress, VerifyReport, _no_progress
from envforge.sources import LoadResult
from envforge.task import Task


@dataclass
class TrackedIngest:
    result: LoadResult
    summary: IngestSummary
    mlflow_run_id: str


def ingest(settings: Settings, paths: Sequence[Path], strict: bool = False, dagster_run_id: str | None = None,
           nested: bool = False) -> TrackedIngest:
    with track.mlflow_run(settings, "ingest", "ingest", {"paths": [str(p) for p in paths], "strict": strict},
                          dagster_run_id, nested) as run:
        result, summary = pipeline.ingest(settings, paths, strict=strict)
        track.log_metrics({"tasks_valid": len(result.tasks), "tasks_added": summary.added,
                           "tasks_unchanged": summary.unchanged, "records_rejected": summary.rejected})
        track.log_json([{"source": p.source, "field": p.field, "reason": p.reason} for p in result.rejects],
                       "rejects.json")
        return TrackedIngest(result, summary, run.info.run_id)


def build_images(settings: Settings, tasks: Sequence[Task], dagster_run_id: str | None = None,
                 nested: bool = False, progress: Progress = _no_progress) -> tuple[ImagesReport, str]:
    with track.mlflow_run(settings, "images", "images", {"n_tasks": len(tasks)}, dagster_run_id, nested) as run:
        report = pipeline.build_images(settings, tasks, progress=progress)
        built = [b for _, b in report.builds]
        track.log_metrics({
            "images_built": sum(not b.cache_hit for b in built), "images_cache_hits": report.cache_hits,
            "image_failures": len(report.failures), "base_build_s": report.base.seconds,
            "base_cache_hit": float(report.base.cache_hit),
            "task_build_s_total": sum(b.seconds for b in built),
        })
        track.log_json({"base": report.base.tag, "images": {t.id: b.tag for t, b in report.builds},
                        "failures": [str(p) for p in report.failures]}, "images.json")
        return report, run.info.run_id


def verify_solutions(settings: Settings, tasks: Sequence[Task], images: dict[str, str],
                     dagster_run_id: str | None = None, nested: bool = False, concurrency: int = 2,
                     progress: Progress = _no_progress) -> tuple[VerifyReport, str, Path]:
    with track.mlflow_run(settings, "verify-solutions", "verify", {"n_tasks": len(tasks), "concurrency": concurrency},
                          dagster_run_id, nested) as run:
        report = pipeline.verify_solutions(settings, tasks, images, concurrency=concurrency, progress=progress,
                                           mlflow_run_id=run.info.run_id, dagster_run_id=dagster_run_id)
        rows = report.rows()
        ref = [r for r in rows if r["solution"] == "reference"]
        empty = [r for r in rows if r["solution"] == "empty"]
        track.log_metrics({
            "reference_pass_rate": sum(r["resolved"] for r in ref) / max(1, len(ref)),
            "empty_fail_rate": sum(not r["resolved"] for r in empty) / max(1, len(empty)),
            "tasks_verified": len(report.verified_tasks()), "infra_failures": len(report.infra_failures),
            "sandbox_seconds_total": sum(r["duration_s"] for r in rows),
        })
        chart = solution_outcomes_chart(rows, settings.data_dir / "charts" / "verifier_sanity.png")
        track.log_png(chart)
        track.log_json(rows, "results.json")
        return report, run.info.run_id, chart


def create_task_set(settings: Settings, name: str, tasks: Sequence[Task], params: dict) -> tuple[str, Path]:
    catalog = Catalog(settings.catalog_path)
    version = catalog.create_task_set(name, tasks, params)
    path = catalog.export_task_set(version, settings.data_dir / "task_sets" / f"{name}-{version[:12]}.parquet")
    track.log_metrics({"task_set_size": len(tasks)})
    track.log_json({"name": name, "version": version, "parquet": str(path)}, "task_set.json")
    return version, path
