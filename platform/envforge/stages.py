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
    sources: list[pipeline.SourceIngest]


def ingest(settings: Settings, paths: Sequence[Path], strict: bool = False, dagster_run_id: str | None = None,
           nested: bool = False, progress: Progress = _no_progress) -> TrackedIngest:
    with track.mlflow_run(settings, "ingest", "ingest", {"paths": [str(p) for p in paths], "strict": strict},
                          dagster_run_id, nested) as run:
        report = pipeline.ingest(settings, paths, strict=strict, progress=progress)
        result, summary = report.result, report.summary
        total = len(result.tasks) + len(result.rejects)
        track.log_metrics({"tasks_valid": len(result.tasks), "tasks_added": summary.added,
                           "tasks_unchanged": summary.unchanged, "records_rejected": summary.rejected,
                           "reject_rate": len(result.rejects) / total if total else 0.0})
        track.log_json([{"source": p.source, "field": p.field, "reason": p.reason} for p in result.rejects],
                       "rejects.json")
        track.log_json(report.rows(), "sources.json")
        return TrackedIngest(result, summary, run.info.run_id, report.sources)


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


def rollout(settings: Settings, tasks: Sequence[Task], policy_spec: str, config, task_set_version: str = "",
            batch_id: str | None = None, root: str | None = None, dagster_run_id: str | None = None,
            nested: bool = False, progress: Progress = _no_progress):
    """A rollout batch (images built as needed), logged: params, metrics, and the batch summary."""
    from envforge.rollout.batch import run_batch
    from envforge.rollout.policies.factory import make_policy

    params = {"policy": policy_spec, "task_set_version": task_set_version, "n_tasks": len(tasks),
              **{f"rollout.{k}": v for k, v in config.as_params().items()}}
    with track.mlflow_run(settings, "rollout", "rollout", params, dagster_run_id, nested) as run:
        images = pipeline.build_images(settings, tasks, progress=progress)
        image_for = images.image_for()
        items = [(t, image_for[t.content_hash]) for t in tasks if t.content_hash in image_for]
        policy = make_policy(policy_spec)
        result = run_batch(settings, items, policy, config, task_set_version=task_set_version, batch_id=batch_id,
                           root=root, progress=progress)
        track.log_metrics(result.metrics)
        track.log_json({"batch_id": result.store.batch_id, "location": f"{result.store.root}/{result.store.batch_id}",
                        "dropped_groups": [g.to_json() for g in result.report.dropped_groups]}, "rollout_batch.json")
        result.mlflow_run_id = run.info.run_id
        return result


def tier_task_set(settings: Settings, version: str, policy_spec: str | None = None, k: int = 8,
                  eval_fraction: float = 0.2, seed: int = 0, concurrency: int = 4,
                  dagster_run_id: str | None = None, nested: bool = False, progress: Progress = _no_progress):
    """Difficulty tiers (pass@k of a reference policy, or static features) and a stratified split.

    Returns (tier rows as dicts, histogram PNG, MLflow run id).
    """
    from envforge.charts import tier_histogram
    from envforge.rollout.batch import run_batch
    from envforge.rollout.policies.factory import make_policy
    from envforge.rollout.scheduler import RolloutConfig
    from envforge.rollout.tiers import static_tiers, stratified_split, tiers_from_passes

    catalog = Catalog(settings.catalog_path)
    version = catalog.resolve_task_set(version)
    tasks = catalog.load_task_set(version)
    params = {"task_set_version": version, "policy": policy_spec or "static", "k": k, "eval_fraction": eval_fraction,
              "seed": seed}
    with track.mlflow_run(settings, "tiers", "tiers", params, dagster_run_id, nested) as run:
        policy_id = "static"
        if policy_spec:
            images = pipeline.build_images(settings, tasks, progress=progress).image_for()
            policy = make_policy(policy_spec)
            policy_id = getattr(policy, "policy_id", policy_spec)
            result = run_batch(settings, [(t, images[t.content_hash]) for t in tasks if t.content_hash in images],
                               policy, RolloutConfig(n_samples=k, concurrency=concurrency, seed=seed),
                               task_set_version=version, batch_id=f"tiers-{version[:12]}-k{k}-s{seed}",
                               progress=progress)
            solved: dict[str, tuple[int, int]] = {}
            for t in result.store.trajectories():
                n, c = solved.get(t.task_id, (0, 0))
                solved[t.task_id] = (n + int(t.resolved), c + 1)
            rows = tiers_from_passes(tasks, solved)
            track.log_metrics({f"reference_{key}": v for key, v in result.metrics.items()})
        else:
            rows = static_tiers(tasks)
        rows = stratified_split(rows, eval_fraction, seed)
        dicts = [dict(r.__dict__, policy_id=policy_id if r.method == "pass@k" else "static") for r in rows]
        catalog.record_tiers(version, dicts)
        chart = tier_histogram(dicts, settings.data_dir / "charts" / f"tiers-{version[:12]}.png")
        track.log_png(chart)
        track.log_json(dicts, "tiers.json")
        for tier in ("unsolved", "hard", "medium", "easy", "trivial"):
            track.log_metrics({f"tier_{tier}": sum(1 for r in rows if r.tier == tier)})
        track.log_metrics({"train": sum(r.split == "train" for r in rows), "eval": sum(r.split == "eval" for r in rows)})
        return dicts, chart, run.info.run_id
