"""The stages of the main job as plain functions, shared by the CLI and the Dagster assets.

Each stage takes settings and inputs, does real work, records it in the catalog, and
returns a small report; MLflow logging and progress display are the callers' business.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import docker

from envforge.catalog import Catalog, IngestSummary
from envforge.config import Settings
from envforge.errors import ImageBuildError, InfraError, Problem
from envforge.sandbox.engine import docker_client
from envforge.sandbox.images import ImageBuild, build_base_image, build_task_image
from envforge.sources import LoadResult, load_specs
from envforge.task import Task
from envforge.sandbox.pool import SandboxPool
from envforge.verify.gate import GateConfig, GateReport, validate_task
from envforge.verify.grader import Grader

# (stage, detail, done, total): called as work advances, so callers can draw bars or log lines.
Progress = Callable[[str, str, int, int], None]


def _no_progress(stage: str, detail: str, done: int, total: int) -> None:
    pass


@dataclass
class ImagesReport:
    base: ImageBuild
    builds: list[tuple[Task, ImageBuild]] = field(default_factory=list)
    failures: list[Problem] = field(default_factory=list)

    @property
    def cache_hits(self) -> int:
        return sum(b.cache_hit for _, b in self.builds)

    def image_for(self) -> dict[str, str]:
        return {t.content_hash: b.tag for t, b in self.builds}


@dataclass
class ValidationReport:
    reports: list[GateReport] = field(default_factory=list)
    infra_failures: list[Problem] = field(default_factory=list)

    def accepted(self, tasks: Sequence[Task]) -> list[Task]:
        ok = {r.content_hash for r in self.reports if r.accepted}
        return [t for t in tasks if t.content_hash in ok]

    def rows(self) -> list[dict]:
        return [{"task_id": r.task_id, "verdict": r.verdict, "reference_passes": r.reference_passes,
                 "empty_fails": r.empty_fails, "runs": r.runs, "disagreements": r.disagreements[:5],
                 "probes_caught": sum(p["reward"] == 0 for p in r.probe_results.values()),
                 "probes": len(r.probe_results), "verifier_median_s": round(r.median_verifier_s, 2)}
                for r in self.reports]


def ingest(settings: Settings, paths: Sequence[Path], strict: bool = False) -> tuple[LoadResult, IngestSummary]:
    """Parse spec files/directories and store good tasks and rejects in the catalog."""
    result = load_specs(paths)
    summary = Catalog(settings.catalog_path).ingest(result, source_kind="spec", strict=strict)
    return result, summary


def build_images(settings: Settings, tasks: Sequence[Task], client: docker.DockerClient | None = None,
                 progress: Progress = _no_progress, log: Callable[[str], None] = lambda _: None) -> ImagesReport:
    """Make sure the base image and every task's image exist; a failing task does not stop the rest."""
    client = client or docker_client(settings)
    total = len(tasks) + 1
    progress("images", "base image (first build takes 1-2 minutes)", 0, total)
    base = build_base_image(client, settings, log=log)
    report = ImagesReport(base=base)
    for i, task in enumerate(tasks, start=1):
        progress("images", task.id, i, total)
        try:
            report.builds.append((task, build_task_image(client, task, base.tag, settings, log=log)))
        except ImageBuildError as exc:
            report.failures.append(Problem(task.origin, "environment", str(exc)))
    progress("images", "done", total, total)
    if report.builds:
        Catalog(settings.catalog_path).record_images(report.builds)
    return report


def validate(settings: Settings, tasks: Sequence[Task], images: dict[str, str], config: GateConfig = GateConfig(),
             concurrency: int = 2, client: docker.DockerClient | None = None, progress: Progress = _no_progress,
             mlflow_run_id: str | None = None, dagster_run_id: str | None = None) -> ValidationReport:
    """Run the flakiness gate on every task (tasks in parallel, one warm pool) and record the verdicts."""
    client = client or docker_client(settings)
    report = ValidationReport()
    todo = []
    for t in tasks:
        if t.content_hash in images:
            todo.append(t)
        else:
            report.infra_failures.append(Problem(t.origin, "environment", "no image built for this task version"))
    progress("validate", "starting sandboxes", 0, len(todo))
    with SandboxPool(client, max_idle_per_key=2, max_starting=concurrency) as pool:
        grader = Grader(client, pool)
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as ex:
            futures = {ex.submit(validate_task, grader, t, images[t.content_hash], config): t for t in todo}
            for done, fut in enumerate(as_completed(futures), start=1):
                task = futures[fut]
                try:
                    report.reports.append(fut.result())
                except InfraError as exc:
                    report.infra_failures.append(Problem(task.origin, "verification", str(exc)))
                progress("validate", task.id, done, len(todo))
    report.reports.sort(key=lambda r: r.task_id)
    if report.reports:
        Catalog(settings.catalog_path).record_validations(report.reports, config.as_params(), mlflow_run_id,
                                                          dagster_run_id)
    return report
