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
from envforge.verify.result import VerificationResult
from envforge.verify.solutions import SolutionKind, run_solution

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
class VerifyReport:
    results: list[tuple[Task, VerificationResult]] = field(default_factory=list)
    infra_failures: list[Problem] = field(default_factory=list)

    def verified_tasks(self) -> list[Task]:
        """Tasks whose reference solution resolves and whose empty solution does not."""
        by_task: dict[str, dict[str, VerificationResult]] = {}
        tasks: dict[str, Task] = {}
        for t, r in self.results:
            by_task.setdefault(t.id, {})[r.solution] = r
            tasks[t.id] = t
        return [tasks[tid] for tid, rs in sorted(by_task.items())
                if rs.get("reference") and rs["reference"].resolved and rs.get("empty") and not rs["empty"].resolved]

    def rows(self) -> list[dict]:
        return [{"task_id": t.id, "solution": r.solution, "reward": r.reward, "resolved": r.resolved,
                 "reasons": r.reasons, "duration_s": round(r.duration_s, 2)} for t, r in self.results]


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


def verify_solutions(settings: Settings, tasks: Sequence[Task], images: dict[str, str],
                     solutions: Iterable[SolutionKind] = ("reference", "empty"), concurrency: int = 2,
                     client: docker.DockerClient | None = None, progress: Progress = _no_progress,
                     mlflow_run_id: str | None = None, dagster_run_id: str | None = None) -> VerifyReport:
    """Run each task's known solutions in fresh sandboxes and record every result in the catalog."""
    client = client or docker_client(settings)
    jobs = [(t, s) for t in tasks for s in solutions]
    report = VerifyReport()
    missing = [t for t in tasks if t.content_hash not in images]
    for t in missing:
        report.infra_failures.append(Problem(t.origin, "environment", "no image built for this task version"))
    jobs = [(t, s) for t, s in jobs if t.content_hash in images]
    done = 0
    progress("verify", "starting sandboxes", 0, len(jobs))
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        futures = {pool.submit(run_solution, client, t, images[t.content_hash], s): (t, s) for t, s in jobs}
        for fut in as_completed(futures):
            task, solution = futures[fut]
            try:
                report.results.append((task, fut.result()))
            except InfraError as exc:
                report.infra_failures.append(Problem(task.origin, f"{solution} solution", str(exc)))
            done += 1
            progress("verify", f"{task.id} ({solution})", done, len(jobs))
    report.results.sort(key=lambda tr: (tr[0].id, tr[1].solution))
    if report.results:
        Catalog(settings.catalog_path).record_runs(report.results, mlflow_run_id, dagster_run_id)
    return report
