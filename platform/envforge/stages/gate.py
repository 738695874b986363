"""The flakiness gate: every task's verifier proven by repeated runs on pristine copies and hack probes."""

from __future__ import annotations

import statistics
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import docker

from envforge.catalog import Catalog
from envforge.config import Settings
from envforge.errors import InfraError, Problem
from envforge.sandbox.engine import docker_client
from envforge.sandbox.pool import SandboxPool
from envforge.stages.base import StageContext, StageResult, stage
from envforge.stages.images import ImageSet
from envforge.task import Task
from envforge.verify.config import GateConfig
from envforge.verify.gate import GateReport, validate_task
from envforge.verify.grader import Grader


@dataclass
class GateResult(StageResult):
    reports: list[GateReport] = field(default_factory=list)
    ungated: list[tuple[Task, Problem]] = field(default_factory=list)  # no image, or the infrastructure failed
    chart: Path | None = None
    n_tasks: int = 0

    @property
    def infra_failures(self) -> list[Problem]:
        return [p for _, p in self.ungated]

    def accepted_hashes(self) -> list[str]:
        return [r.content_hash for r in self.reports if r.accepted]

    def removed(self) -> list[dict]:
        """Tasks the gate kept out, with why: quarantined (the disagreements) or not gated (the fault)."""
        out = [{"task_id": r.task_id, "content_hash": r.content_hash, "stage": "quarantined",
                "reason": "; ".join(r.disagreements[:5])} for r in self.reports if not r.accepted]
        out += [{"task_id": t.id, "content_hash": t.content_hash, "stage": "not gated", "reason": p.reason}
                for t, p in self.ungated]
        return out

    def rows(self) -> list[dict]:
        return [{"task_id": r.task_id, "verdict": r.verdict, "reference_passes": r.reference_passes,
                 "empty_fails": r.empty_fails, "runs": r.runs, "disagreements": r.disagreements[:5],
                 "probes_caught": sum(p["reward"] == 0 for p in r.probe_results.values()),
                 "probes": len(r.probe_results), "verifier_median_s": round(r.median_verifier_s, 2)}
                for r in self.reports]

    def params(self) -> dict[str, Any]:
        return {"n_tasks": self.n_tasks}

    def metrics(self) -> dict[str, float]:
        accepted = sum(r.accepted for r in self.reports)
        return {"tasks_accepted": accepted, "tasks_quarantined": len(self.reports) - accepted,
                "quarantine_rate": (len(self.reports) - accepted) / max(1, len(self.reports)),
                "infra_failures": len(self.infra_failures),
                "infra_retries": sum(r.infra_retries for r in self.reports),
                "verifier_median_s": statistics.median([r.median_verifier_s for r in self.reports] or [0.0])}

    def artifacts(self) -> dict[str, Any]:
        return {"flake_report.json": self.rows(), "probes.json": {r.task_id: r.probe_results for r in self.reports}}

    def charts(self) -> list[Path]:
        return [self.chart] if self.chart else []


@stage("validate")
def gate(settings: Settings, config: GateConfig, tasks: Sequence[Task], images: ImageSet,
         context: StageContext = StageContext(), client: docker.DockerClient | None = None) -> GateResult:
    """Run the flakiness gate on every task (tasks in parallel, one warm pool) and record the verdicts.

    A task without an image in `images` is not gated; it is reported as an infrastructure failure.
    """
    from envforge.charts import flake_chart

    client = client or docker_client(settings)
    progress = context.progress
    result = GateResult(n_tasks=len(tasks))
    items = images.items(tasks)
    for t in images.missing(tasks):
        result.ungated.append((t, Problem(t.origin, "environment", "no image built for this task version")))
    progress("validate", "starting sandboxes", 0, len(items))
    with SandboxPool(client, max_idle_per_key=2, max_starting=config.concurrency) as pool:
        grader = Grader(client, pool)
        with ThreadPoolExecutor(max_workers=max(1, config.concurrency)) as ex:
            futures = {ex.submit(validate_task, grader, t, image, config): t for t, image in items}
            for done, fut in enumerate(as_completed(futures), start=1):
                task = futures[fut]
                try:
                    result.reports.append(fut.result())
                except InfraError as exc:
                    result.ungated.append((task, Problem(task.origin, "verification", str(exc))))
                progress("validate", task.id, done, len(items))
    result.reports.sort(key=lambda r: r.task_id)
    if result.reports:
        Catalog(settings.catalog_path).record_validations(result.reports, config.as_params(), context.mlflow_run_id,
                                                          context.dagster_run_id)
    result.chart = flake_chart(result.rows(), settings.charts_dir / "flake_report.png")
    return result
