"""Pipeline stages wrapped in MLflow runs: what the CLI, the demo and the Dagster assets call.

`pipeline` does the work; this module adds the record of it (params, metrics, tables,
charts) so that every entry point logs the same things the same way.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from envforge import pipeline, track
from envforge.catalog import Catalog, IngestSummary
from envforge.charts import flake_chart, similarity_histogram
from envforge.config import Settings
from envforge.pipeline import ImagesReport, Progress, QualityReport, ValidationReport, _no_progress
from envforge.quality.params import DedupConfig
from envforge.sources import LoadResult
from envforge.task import Task
from envforge.verify.gate import GateConfig


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


def decontaminate(settings: Settings, tasks: Sequence[Task], config: DedupConfig = DedupConfig(),
                  dagster_run_id: str | None = None, nested: bool = False) -> tuple[QualityReport, str, Path]:
    """Decontamination and dedup, logged: verdicts, the contamination table and a similarity histogram."""
    with track.mlflow_run(settings, "decontaminate", "quality", {"n_tasks": len(tasks), **config.as_params()},
                          dagster_run_id, nested) as run:
        report = pipeline.decontaminate(settings, tasks, config=config)
        statuses = [r["status"] for r in report.rows]
        track.log_metrics({
            "tasks_checked": len(report.rows), "tasks_clean": statuses.count("clean"),
            "tasks_contaminated": statuses.count("contaminated"), "tasks_duplicate": statuses.count("duplicate"),
            "duplicate_pairs": len(report.pairs), "index_docs_added": report.sync.added_docs,
        })
        chart = similarity_histogram([r["exact_jaccard"] for r in report.rows],
                                     [r["nearest_task_jaccard"] for r in report.rows], config.threshold,
                                     settings.data_dir / "charts" / "similarity_histogram.png")
        track.log_png(chart)
        track.log_json(report.rows, "contamination_report.json")
        return report, run.info.run_id, chart


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


def validate(settings: Settings, tasks: Sequence[Task], images: dict[str, str], config: GateConfig = GateConfig(),
             dagster_run_id: str | None = None, nested: bool = False, concurrency: int = 2,
             progress: Progress = _no_progress) -> tuple[ValidationReport, str, Path]:
    """The flakiness gate, logged: verdicts, the flake report table and its chart."""
    with track.mlflow_run(settings, "validate", "validate", {"n_tasks": len(tasks), **config.as_params()},
                          dagster_run_id, nested) as run:
        report = pipeline.validate(settings, tasks, images, config, concurrency=concurrency, progress=progress,
                                   mlflow_run_id=run.info.run_id, dagster_run_id=dagster_run_id)
        rows = report.rows()
        accepted = sum(r.accepted for r in report.reports)
        track.log_metrics({
            "tasks_accepted": accepted, "tasks_quarantined": len(report.reports) - accepted,
            "quarantine_rate": (len(report.reports) - accepted) / max(1, len(report.reports)),
            "infra_failures": len(report.infra_failures),
            "infra_retries": sum(r.infra_retries for r in report.reports),
            "verifier_median_s": statistics.median([r.median_verifier_s for r in report.reports] or [0.0]),
        })
        chart = flake_chart(rows, settings.data_dir / "charts" / "flake_report.png")
        track.log_png(chart)
        track.log_json(rows, "flake_report.json")
        track.log_json({r.task_id: r.probe_results for r in report.reports}, "probes.json")
        return report, run.info.run_id, chart


def create_task_set(settings: Settings, name: str, tasks: Sequence[Task], params: dict,
                    sources: list[str] | None = None, removed: list[dict] | None = None) -> tuple[str, Path]:
    catalog = Catalog(settings.catalog_path)
    version = catalog.create_task_set(name, tasks, params, sources=sources, removed=removed)
    path = catalog.export_task_set(version, settings.data_dir / "task_sets" / f"{name}-{version[:12]}.parquet")
    track.log_metrics({"task_set_size": len(tasks)})
    track.log_json({"name": name, "version": version, "parquet": str(path)}, "task_set.json")
    return version, path
