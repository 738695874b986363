"""The stages of the main job as plain functions, shared by the CLI and the Dagster assets.

Each stage takes settings and inputs, does real work, records it in the catalog, and
returns a small report; MLflow logging and progress display are the callers' business.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import docker

from envforge.catalog import Catalog, IngestSummary
from envforge.config import Settings
from envforge.errors import ImageBuildError, InfraError, Problem
from envforge.sandbox.engine import docker_client
from envforge.sandbox.images import ImageBuild, build_base_image, build_task_image, image_digest
from envforge.sources import LoadResult
from envforge.task import Task
from envforge.quality.dedup import Cluster, ContaminationRecord, DuplicatePair, clusters, near_duplicate_pairs
from envforge.quality.dedup import decontaminate as decontaminate_tasks
from envforge.quality.params import DedupConfig
from envforge.quality.reference_index import ReferenceIndex, SyncReport
from envforge.sandbox.pool import SandboxPool
from envforge.verify.gate import GateConfig, GateReport, gate_key, validate_task
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
    reports: list[GateReport] = field(default_factory=list)  # every task's verdict, kept ones included
    infra_failures: list[Problem] = field(default_factory=list)

    def accepted(self, tasks: Sequence[Task]) -> list[Task]:
        ok = {r.content_hash for r in self.reports if r.accepted}
        return [t for t in tasks if t.content_hash in ok]

    @property
    def kept(self) -> list[GateReport]:
        """Verdicts of unchanged tasks (same content, image and gate parameters), not re-gated."""
        return [r for r in self.reports if r.reused_from is not None]

    def rows(self) -> list[dict]:
        return [{"task_id": r.task_id, "verdict": r.verdict, "reference_passes": r.reference_passes,
                 "empty_fails": r.empty_fails, "runs": r.runs, "empty_runs": r.empty_runs,
                 "disagreements": r.disagreements[:5],
                 "probes_caught": sum(p["reward"] == 0 for p in r.probe_results.values()),
                 "probes": len(r.probe_results), "probes_skipped": len(r.probes_skipped),
                 "gradings": r.gradings, "stopped_early": r.stopped_early, "kept": r.reused_from is not None,
                 "gate_s": round(r.wall_s, 2), "sandbox_s": round(r.sandbox_s, 2),
                 "verifier_median_s": round(r.median_verifier_s, 2)}
                for r in self.reports]


def kept_report(row: dict) -> GateReport:
    """A stored verdict (a `validations` row) as the report of an unchanged task."""
    stats = json.loads(row.get("stats_json") or "{}")
    return GateReport(
        task_id=row["task_id"], content_hash=row["content_hash"], accepted=row["verdict"] == "accepted",
        disagreements=list(row["disagreements"]), reference_passes=row["reference_passes"],
        empty_fails=row["empty_fails"], runs=row["runs"], probe_results=json.loads(row["probes_json"]),
        verifier_seconds=[row["verifier_median_s"]], infra_retries=row["infra_retries"],
        empty_runs=stats.get("empty_runs", row["runs"]), probes_skipped=stats.get("probes_skipped", {}),
        not_run=stats.get("not_run", []), gradings=stats.get("gradings", 0), sandbox_s=stats.get("sandbox_s", 0.0),
        wall_s=stats.get("wall_s", 0.0), image_digest=row["image_digest"], gate_key=row["gate_key"],
        reused_from=row["created_at"])


@dataclass
class SourceIngest:
    """What one source yielded in one ingest."""

    key: str
    kind: str
    fingerprint: str
    result: LoadResult
    summary: IngestSummary | None = None


@dataclass
class IngestReport:
    result: LoadResult  # every source merged
    summary: IngestSummary
    sources: list[SourceIngest] = field(default_factory=list)

    def rows(self) -> list[dict]:
        return [{"source": s.key, "kind": s.kind, "valid": len(s.result.tasks), "rejected": len(s.result.rejects),
                 "added": s.summary.added if s.summary else 0} for s in self.sources]


def derive_candidates(settings: Settings, result: LoadResult, client: docker.DockerClient | None = None,
                      progress: Progress = _no_progress) -> None:
    """Turn the result's candidates into tasks or rejects in place, by running their tests."""
    from envforge.sources.derive import derive_tasks

    if not result.candidates:
        return
    try:
        derived = derive_tasks(settings, result.candidates, client=client, progress=progress)
    except InfraError as exc:
        derived = LoadResult(rejects=[Problem(c.origin, c.field, f"infra: cannot run the tests to derive "
                                                                f"FAIL_TO_PASS: {exc}") for c in result.candidates])
    result.candidates = []
    result.extend(derived)


def ingest(settings: Settings, paths: Sequence[Path], strict: bool = False, client: docker.DockerClient | None = None,
           progress: Progress = _no_progress) -> IngestReport:
    """Load every source under the paths, derive tests for history-mined candidates, store each
    source's tasks and rejects as that source's latest load.

    With strict=True a bad record anywhere refuses the whole batch (nothing is written).
    """
    from envforge.sources import fingerprint, load_by_source

    loaded, problems = load_by_source(paths)
    root = settings.task_sources_dir
    sources = []
    for i, (ref, res) in enumerate(loaded, start=1):
        progress("ingest", ref.key(root), i, len(loaded))
        derive_candidates(settings, res, client=client, progress=progress)
        sources.append(SourceIngest(ref.key(root), ref.kind, fingerprint(ref), res))
    combined = LoadResult(rejects=list(problems))
    for s in sources:
        combined.extend(s.result)
    catalog = Catalog(settings.catalog_path)
    if strict and combined.rejects:
        catalog.ingest(combined, strict=True)  # raises BatchRejectedError listing every problem
    summaries = [catalog.ingest(LoadResult(rejects=list(problems)), source_kind="path")] if problems else []
    for s in sources:
        s.summary = catalog.ingest(s.result, source_kind=s.kind, source_key=s.key, fingerprint=s.fingerprint)
        summaries.append(s.summary)
    summary = IngestSummary(summaries[0].batch_id if summaries else "", sum(x.added for x in summaries),
                            sum(x.unchanged for x in summaries), sum(x.rejected for x in summaries))
    return IngestReport(combined, summary, sources)


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
             mlflow_run_id: str | None = None, dagster_run_id: str | None = None,
             force: bool = False) -> ValidationReport:
    """Run the flakiness gate on every task (tasks in parallel, one warm pool) and record the verdicts.

    A task whose content hash, image digest and gate parameters (and the verifier's code) are
    unchanged keeps its stored verdict without a sandbox: the nightly refresh re-gates only
    what changed. `force=True` re-gates everything.
    """
    client = client or docker_client(settings)
    report = ValidationReport()
    keyed: list[tuple[Task, str, str]] = []
    for t in tasks:
        digest = image_digest(client, images[t.content_hash]) if t.content_hash in images else None
        if digest is None:
            report.infra_failures.append(Problem(t.origin, "environment", "no image built for this task version"))
        else:
            keyed.append((t, digest, gate_key(t, digest, config)))
    kept = {} if force else Catalog(settings.catalog_path).validations_by_key(k for *_, k in keyed)
    report.reports += [kept_report(kept[k]) for _, _, k in keyed if k in kept]
    todo = [(t, d, k) for t, d, k in keyed if k not in kept]
    if report.reports:
        progress("validate", f"{len(report.reports)} unchanged tasks keep their verdicts", 0, len(todo))
    if todo:
        progress("validate", "starting sandboxes", 0, len(todo))
        with SandboxPool(client, max_idle_per_key=max(2, config.workers), max_starting=concurrency) as pool:
            grader = Grader(client, pool)
            with ThreadPoolExecutor(max_workers=max(1, concurrency)) as ex:
                futures = {ex.submit(validate_task, grader, t, images[t.content_hash], config): (t, d, k)
                           for t, d, k in todo}
                new = []
                for done, fut in enumerate(as_completed(futures), start=1):
                    task, digest, key = futures[fut]
                    try:
                        gate = fut.result()
                    except InfraError as exc:
                        report.infra_failures.append(Problem(task.origin, "verification", str(exc)))
                    else:
                        gate.image_digest, gate.gate_key = digest, key
                        new.append(gate)
                    progress("validate", task.id, done, len(todo))
        if new:
            Catalog(settings.catalog_path).record_validations(new, config.as_params(), mlflow_run_id,
                                                              dagster_run_id)
        report.reports += new
    report.reports.sort(key=lambda r: r.task_id)
    return report


@dataclass
class QualityReport:
    """Decontamination and dedup of one batch of tasks."""

    records: list[ContaminationRecord]
    pairs: list[DuplicatePair]
    clusters: list[Cluster]
    rows: list[dict]
    sync: SyncReport

    def kept_ids(self) -> set[str]:
        return {r["task_id"] for r in self.rows if r["status"] == "clean"}

    def removed(self) -> list[dict]:
        return [{"task_id": r["task_id"], "content_hash": r["content_hash"], "stage": r["status"],
                 "reason": r["reason"]} for r in self.rows if r["status"] != "clean"]


def corpora_from_env(environ: dict | None = None) -> dict[str, Path | None]:
    """Built-in HumanEval plus ENVFORGE_CORPORA="name=path;name2=path2" (files or directories)."""
    import os

    env = os.environ if environ is None else environ
    out: dict[str, Path | None] = {"humaneval": None}
    for item in filter(None, (env.get("ENVFORGE_CORPORA") or "").split(";")):
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"ENVFORGE_CORPORA entry {item!r} is not name=path")
        out[name.strip()] = Path(path.strip())
    return out


def decontaminate(settings: Settings, tasks: Sequence[Task], corpora: dict[str, Path | None] | None = None,
                  config: DedupConfig = DedupConfig()) -> QualityReport:
    """Check tasks against the reference corpora and each other; record a verdict per task.

    Tasks already in other task sets take part as `others`: a new task that near-duplicates
    one of them is the duplicate (what is published stays put).
    """
    catalog = Catalog(settings.catalog_path)
    index = ReferenceIndex(settings.data_dir / "dedup" / "reference-index", config)
    sync = index.sync(corpora if corpora is not None else corpora_from_env())
    records = decontaminate_tasks(tasks, index)
    clean = [t for t, r in zip(tasks, records) if not r.contaminated]
    batch_ids = {t.id for t in tasks}
    published = catalog.query("SELECT DISTINCT content_hash FROM task_set_members")["content_hash"].to_list()
    others = [t for t in catalog.load_tasks() if t.content_hash in set(published) and t.id not in batch_ids]
    pairs = near_duplicate_pairs(clean, others, config)
    cl = clusters(clean, pairs)
    dup_of = {m: c.representative for c in cl for m in c.members if m != c.representative}
    other_ids = {o.id for o in others}
    for p in pairs:
        if p.b in other_ids and p.a not in dup_of:
            dup_of[p.a] = p.b
    nearest: dict[str, float] = {}
    for p in pairs:
        for tid in (p.a, p.b):
            nearest[tid] = max(nearest.get(tid, 0.0), p.exact_jaccard)
    rows = []
    for t, r in zip(tasks, records):
        status = "contaminated" if r.contaminated else "duplicate" if t.id in dup_of else "clean"
        reason = r.reason if r.contaminated else (f"near duplicate of {dup_of[t.id]}" if t.id in dup_of else "")
        rows.append({"content_hash": t.content_hash, "task_id": t.id, "status": status, "corpus": r.corpus,
                     "doc_id": r.doc_id, "est_jaccard": float(r.est_jaccard), "exact_jaccard": float(r.exact_jaccard),
                     "longest_shared_ngram": int(r.longest_shared_ngram), "duplicate_of": dup_of.get(t.id),
                     "nearest_task_jaccard": float(nearest.get(t.id, 0.0)), "reason": reason})
    if rows:
        catalog.record_quality(rows, config.as_params())
    return QualityReport(records, pairs, cl, rows, sync)
