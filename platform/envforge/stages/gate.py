"""The flakiness gate: every task's verifier proven by repeated runs on pristine copies and hack probes."""

from __future__ import annotations

import statistics
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import docker
from requests.exceptions import RequestException

from envforge.catalog import Catalog
from envforge.config import Settings
from envforge.errors import InfraError, Problem
from envforge.sandbox.admission import CpuAdmission, admission_for, admitted
from envforge.sandbox.engine import docker_client
from envforge.sandbox.images import image_digest
from envforge.sandbox.provider import or_local
from envforge.stages.base import StageContext, StageResult, stage
from envforge.stages.images import ImageSet
from envforge.task import Task
from envforge.verify.config import GateConfig
from envforge.verify.gate import GateReport, gate_key, gate_sandboxes_per_task, validate_task
from envforge.verify.grader import Grader


@dataclass
class GateResult(StageResult):
    reports: list[GateReport] = field(default_factory=list)  # every task's verdict, kept ones included
    ungated: list[tuple[Task, Problem]] = field(default_factory=list)  # no image, or the infrastructure failed
    chart: Path | None = None
    strength_chart: Path | None = None  # distribution of verifier strength, when it was measured
    n_tasks: int = 0

    @property
    def infra_failures(self) -> list[Problem]:
        return [p for _, p in self.ungated]

    @property
    def kept(self) -> list[GateReport]:
        """Verdicts of unchanged tasks (same content, image digest and gate parameters), not re-gated."""
        return [r for r in self.reports if r.reused_from is not None]

    @property
    def gated(self) -> list[GateReport]:
        return [r for r in self.reports if r.reused_from is None]

    def accepted_hashes(self) -> list[str]:
        return [r.content_hash for r in self.reports if r.accepted]

    def removed(self) -> list[dict]:
        """Tasks the gate kept out, with why: quarantined (the disagreements) or not gated (the fault)."""
        out = [
            {
                "task_id": r.task_id,
                "content_hash": r.content_hash,
                "stage": "quarantined",
                "reason": "; ".join(r.disagreements[:5]),
            }
            for r in self.reports
            if not r.accepted
        ]
        out += [
            {"task_id": t.id, "content_hash": t.content_hash, "stage": "not gated", "reason": p.reason}
            for t, p in self.ungated
        ]
        return out

    def rows(self) -> list[dict]:
        return [
            {
                "task_id": r.task_id,
                "verdict": r.verdict,
                "reference_passes": r.reference_passes,
                "empty_fails": r.empty_fails,
                "runs": r.runs,
                "empty_runs": r.empty_runs,
                "disagreements": r.disagreements[:5],
                "probes_caught": sum(p["reward"] == 0 for p in r.probe_results.values()),
                "probes": len(r.probe_results),
                "probes_skipped": len(r.probes_skipped),
                "gradings": r.gradings,
                "stopped_early": r.stopped_early,
                "kept": r.reused_from is not None,
                "gate_s": round(r.wall_s, 2),
                "sandbox_s": round(r.sandbox_s, 2),
                "verifier_median_s": round(r.median_verifier_s, 2),
                **_strength_row(r),
            }
            for r in self.reports
        ]

    def params(self) -> dict[str, Any]:
        return {"n_tasks": self.n_tasks}

    def metrics(self) -> dict[str, float]:
        accepted = sum(r.accepted for r in self.reports)
        return {
            "tasks_accepted": accepted,
            "tasks_quarantined": len(self.reports) - accepted,
            "quarantine_rate": (len(self.reports) - accepted) / max(1, len(self.reports)),
            "infra_failures": len(self.infra_failures),
            "infra_retries": sum(r.infra_retries for r in self.reports),
            "verifier_median_s": statistics.median([r.median_verifier_s for r in self.reports] or [0.0]),
            "tasks_kept": len(self.kept),
            "gradings": sum(r.gradings for r in self.gated),
            "gate_sandbox_s": sum(r.sandbox_s for r in self.gated),
            **self._strength_metrics(),
        }

    def _strength_metrics(self) -> dict[str, float]:
        measured = [r.strength for r in self.reports if r.strength is not None and r.strength.strength is not None]
        if not measured:
            return {}
        return {
            "strength_median": statistics.median(s.strength for s in measured),
            "strength_measured": len(measured),
            "mutants_median": statistics.median(s.mutants for s in measured),
            "strength_seconds_median": statistics.median(s.seconds for s in measured),
            "overfittable": sum(bool(s.overfittable) for s in measured),
            "weak_form": sum(bool(s.weak_form_passes) for s in measured),
            "audit_only": sum(r.admission == "audit" for r in self.reports),
        }

    def artifacts(self) -> dict[str, Any]:
        return {
            "flake_report.json": self.rows(),
            "probes.json": {r.task_id: r.probe_results for r in self.reports},
            "probes_skipped.json": {r.task_id: r.probes_skipped for r in self.reports},
            **(
                {"strength.json": {r.task_id: r.strength.as_json() for r in self.reports if r.strength}}
                if any(r.strength for r in self.reports)
                else {}
            ),
        }

    def charts(self) -> list[Path]:
        return [c for c in (self.chart, self.strength_chart) if c]


def _strength_row(r: GateReport) -> dict:
    """The flake report's strength columns (None when the task's strength was not measured)."""
    s = r.strength
    return {
        "strength": s.strength if s else None,
        "f2p_strength": s.f2p_strength if s else None,
        "mutants": s.mutants if s else None,
        "survivors": len(s.survivors) if s else None,
        "overfittable": s.overfittable if s else None,
        "weak_form": s.weak_form_passes if s else None,
        "admission": r.admission or None,
    }


def _digest(client: docker.DockerClient, images: ImageSet, tag: str) -> str | None:
    """The image's id as the run recorded it, else as the engine has it (None: no such image)."""
    return images.digests.get(tag) or image_digest(client, tag)


@stage("validate")
def gate(
    settings: Settings,
    config: GateConfig,
    tasks: Sequence[Task],
    images: ImageSet,
    context: StageContext = StageContext(),
    client: docker.DockerClient | None = None,
) -> GateResult:
    """Run the flakiness gate on every task (tasks in parallel, one warm pool) and record the verdicts.

    A task whose content hash, image digest and gate parameters (and the verifier's code) are
    unchanged keeps its stored verdict without a sandbox: the nightly refresh re-gates only what
    changed; `config.force` re-gates everything. A task without an image in `images` is not
    gated; it is reported as an infrastructure failure. The sandboxes run in a pool leased from
    `context.sandboxes` (the provider the process chose: the fleet, docs/fleet.md; none: a warm
    pool on this process's engine). A task whose gate run hits an infrastructure fault (a fleet
    node lost mid-run) is gated again from the start.
    """
    from envforge.charts import flake_chart, strength_chart

    client = client or docker_client(settings)  # images are built and digested on this engine
    progress = context.progress
    catalog = Catalog(settings.catalog_path)
    result = GateResult(n_tasks=len(tasks))
    keyed: list[tuple[Task, str, str, str]] = []  # task, image tag, image digest, gate key
    for t, image in images.items(tasks):
        digest = _digest(client, images, image)
        if digest is None:
            result.ungated.append((t, Problem(t.origin, "environment", f"image {image} is not in the engine")))
        else:
            keyed.append((t, image, digest, gate_key(t, digest, config)))
    for t in images.missing(tasks):
        result.ungated.append((t, Problem(t.origin, "environment", "no image built for this task version")))
    kept = {} if config.force else catalog.validations_by_key(key for *_, key in keyed)
    result.reports += [GateReport.from_row(kept[key]) for *_, key in keyed if key in kept]
    todo = [item for item in keyed if item[3] not in kept]
    if result.reports:
        progress("validate", f"{len(result.reports)} unchanged tasks keep their verdicts", 0, len(todo))
    new: list[GateReport] = []
    if todo:
        # On this engine: `concurrency` tasks of `workers` gradings at once, and more tasks and more gradings
        # of each while the CPUs have room (suites that wait: sandbox/admission.py), so the last task's
        # mutants are not left to two sandboxes; a fleet's nodes are admitted by the fleet.
        local = admission_for(config.concurrency * config.workers)
        per_task = replace(config, workers=max(config.workers, -(-local.ceiling // config.concurrency)))
        sandboxes = or_local(context.sandboxes).lease(
            [(t, image) for t, image, *_ in todo],
            gate_sandboxes_per_task(config),
            client=client,
            settings=settings,
            max_idle_per_key=max(2, per_task.workers),  # a task's sandboxes are kept warm between its gradings
            max_starting=config.concurrency,
        )
        admission: CpuAdmission | None = local
        tasks_at_once = max(config.concurrency, -(-local.ceiling // config.workers))
        if not sandboxes.owned:
            admission, per_task, tasks_at_once = None, config, config.concurrency
        progress("validate", "starting sandboxes", 0, len(todo))
        with sandboxes as leased:
            pool = admitted(leased, admission)
            grader = Grader(client, pool, trusted=True)  # the reference, mutants and probes: no policy code
            with ThreadPoolExecutor(max_workers=max(1, tasks_at_once)) as ex:
                futures = {
                    ex.submit(_gate_with_retries, grader, t, image, per_task): (t, digest, key)
                    for t, image, digest, key in todo
                }
                for done, fut in enumerate(as_completed(futures), start=1):
                    task, digest, key = futures[fut]
                    try:
                        report = fut.result()
                    except (InfraError, docker.errors.DockerException, RequestException) as exc:
                        # a raw client error is the engine going away (a restarted daemon): infra, not a verdict
                        result.ungated.append((task, Problem(task.origin, "verification", str(exc)[:500])))
                    else:
                        report.image_digest, report.gate_key = digest, key
                        new.append(report)
                    progress("validate", task.id, done, len(todo))
    if new:
        catalog.record_validations(new, config.as_params(), context.mlflow_run_id, context.dagster_run_id)
    result.reports = sorted(result.reports + new, key=lambda r: r.task_id)
    result.chart = flake_chart(result.rows(), settings.charts_dir / "flake_report.png")
    scores = [r.strength_score for r in result.reports if r.strength_score is not None]
    if scores:
        result.strength_chart = strength_chart(scores, config.min_strength, settings.charts_dir / "strength.png")
    return result


def _gate_with_retries(grader: Grader, task: Task, image: str, config: GateConfig, attempts: int = 3) -> GateReport:
    """`validate_task`, run again from the start when an infrastructure fault escapes its per-grade retries
    (the reference diff or a probe's sandbox lost with its node)."""
    for attempt in range(attempts):
        try:
            return validate_task(grader, task, image, config)
        except InfraError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")
