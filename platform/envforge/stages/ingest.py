"""Ingest: load task sources, derive tests for history-mined candidates, store each source's load."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence, cast

import docker

from envforge.catalog import Catalog, IngestSummary
from envforge.config import Settings
from envforge.errors import InfraError, Problem
from envforge.progress import Progress, no_progress
from envforge.quality.statement_policy import apply_statement_policy, unchecked
from envforge.quality.statement_review import ReviewOutcome
from envforge.quality.statements import StatementPolicy, StatementSummary
from envforge.sandbox.provider import SandboxProvider, SandboxProviderError
from envforge.sources import LoadResult
from envforge.sources.funnel import Funnel
from envforge.sources.guard import unexpected
from envforge.sources.swebench import record_env_layers
from envforge.stages.base import StageContext, StageResult, stage
from envforge.stages.configs import IngestConfig
from envforge.task import Task


@dataclass
class SourceIngest:
    """What one source yielded in one ingest."""

    key: str
    kind: str
    fingerprint: str
    result: LoadResult
    summary: IngestSummary | None = None
    statements: StatementSummary | None = None  # the statement check's verdicts (None: policy off)

    @property
    def funnel(self) -> Funnel:
        return Funnel.of(len(self.result.tasks), self.result.rejects, len(self.result.skipped))


@dataclass
class IngestResult(StageResult):
    paths: list[Path]
    result: LoadResult  # every source merged
    summary: IngestSummary
    sources: list[SourceIngest] = field(default_factory=list)
    skipped: list[Problem] = field(default_factory=list)  # files that look like sources but are not, and why
    statements: StatementSummary = field(default_factory=StatementSummary)
    review: ReviewOutcome = field(default_factory=ReviewOutcome)  # the optional model review and its agreement

    def rows(self) -> list[dict]:
        return [
            {
                "source": s.key,
                "kind": s.kind,
                "valid": len(s.result.tasks),
                "rejected": len(s.result.rejects),
                "added": s.summary.added if s.summary else 0,
                "statements": s.statements.verdicts if s.statements else {},
                "funnel": s.funnel.as_json(),
            }
            for s in self.sources
        ]

    def funnel(self) -> Funnel:
        """Every source's funnel added up."""
        total = Funnel()
        for s in self.sources:
            total.merge(s.funnel)
        return total

    def params(self) -> dict[str, Any]:
        return {"paths": [str(p) for p in self.paths]}

    def metrics(self) -> dict[str, float]:
        res, summary = self.result, self.summary
        total = len(res.tasks) + len(res.rejects)
        env_layers = {(t.spec.metadata.get("images") or {}).get("env") for t in res.tasks} - {None}
        agreement = self.review.agreement_rate()
        return {
            "tasks_valid": len(res.tasks),
            "tasks_added": summary.added,
            "tasks_unchanged": summary.unchanged,
            "records_rejected": summary.rejected,
            "reject_rate": len(res.rejects) / total if total else 0.0,
            "env_layers": len(env_layers),
            **{f"statements_{verdict}": float(n) for verdict, n in sorted(self.statements.verdicts.items())},
            **{f"funnel_{k}": float(v) for k, v in self.funnel().as_json().items() if isinstance(v, int)},
            **({"statement_review_agreement": agreement} if agreement is not None else {}),
        }

    def artifacts(self) -> dict[str, Any]:
        return {
            "rejects.json": [{"source": p.source, "field": p.field, "reason": p.reason} for p in self.result.rejects],
            "sources.json": self.rows(),
            **({"statements.json": self.statements.as_json()} if self.statements.checked else {}),
            **({"statement_review.json": self.review.as_json()} if self.review.status != "off" else {}),
            **({"skipped.json": [p.as_json() for p in self.skipped]} if self.skipped else {}),
        }


def derive_candidates(
    settings: Settings,
    result: LoadResult,
    client: docker.DockerClient | None = None,
    progress: Progress = no_progress,
    sandboxes: SandboxProvider | None = None,
) -> None:
    """Turn the result's candidates into tasks or rejects in place, by running their tests."""
    from envforge.sources.derive import derive_tasks

    if not result.candidates:
        return
    try:
        derived = derive_tasks(settings, result.candidates, client=client, progress=progress, sandboxes=sandboxes)
    except SandboxProviderError:
        raise  # ENVFORGE_RAY_ADDRESS names no usable fleet: the deployment's error, not the records'
    except InfraError as exc:
        derived = LoadResult(
            rejects=[
                Problem(c.origin, c.field, f"infra: cannot run the tests to derive FAIL_TO_PASS: {exc}")
                for c in result.candidates
            ]
        )
    except Exception as exc:  # noqa: BLE001 - this source's candidates are lost, never the batch
        derived = LoadResult(rejects=[unexpected(c.origin, exc) for c in result.candidates])
    result.candidates = []
    result.extend(derived)


@stage("ingest")
def ingest(
    settings: Settings,
    config: IngestConfig,
    paths: Sequence[Path],
    context: StageContext = StageContext(),
    client: docker.DockerClient | None = None,
) -> IngestResult:
    """Load every source under the paths, derive tests for history-mined candidates, store each
    source's tasks and rejects as that source's latest load.

    With config.strict a bad record anywhere refuses the whole batch (nothing is written).
    """
    from envforge.sources import fingerprint, load_by_source, scan_sources

    progress = context.progress
    discovery = scan_sources(paths)
    loaded, problems = load_by_source(paths, discovery)
    root = settings.task_sources_dir
    catalog = Catalog(settings.catalog_path)
    sources = []
    statements, reviews = StatementSummary(), ReviewOutcome()
    for i, (ref, res) in enumerate(loaded, start=1):
        progress("ingest", ref.key(root), i, len(loaded))
        carried = (
            carry_over(catalog, ref.key(root), res, config.statements)
            if ref.kind == "history" and config.incremental
            else CarriedOver()
        )
        derive_candidates(settings, res, client=client, progress=progress, sandboxes=context.sandboxes)
        if ref.kind == "swebench":
            record_env_layers(settings, res, client=client)
        checked = apply_statement_policy(
            [*res.tasks, *carried.to_check],
            cast(StatementPolicy, config.statements),
            settings.data_dir,
            review=config.review,
        )
        # carried.tasks were checked under this same policy when first ingested: their verdicts stand
        res.tasks = [*checked.tasks, *carried.tasks]
        res.rejects = [*res.rejects, *checked.rejects, *carried.rejects]
        statements.merge(checked.summary)
        reviews.merge(checked.review)
        sources.append(SourceIngest(ref.key(root), ref.kind, fingerprint(ref), res, statements=checked.summary))
    owners = catalog.current_owners(t.id for s in sources for t in s.result.tasks)
    for s in sources:
        _reject_ids_of_other_sources(owners, s.result, s.key)
    combined = LoadResult(rejects=list(problems))
    for s in sources:
        combined.extend(s.result)
    if config.strict and combined.rejects:
        catalog.ingest(combined, strict=True)  # raises BatchRejectedError listing every problem
    summaries = [catalog.ingest(LoadResult(rejects=list(problems)), source_kind="path")] if problems else []
    for s in sources:
        s.summary = catalog.ingest(
            s.result,
            source_kind=s.kind,
            source_key=s.key,
            fingerprint=s.fingerprint,
            cursor=s.result.cursor,
            statements=config.statements,
        )
        summaries.append(s.summary)
    summary = IngestSummary(
        summaries[0].batch_id if summaries else "",
        sum(x.added for x in summaries),
        sum(x.unchanged for x in summaries),
        sum(x.rejected for x in summaries),
    )
    return IngestResult(list(paths), combined, summary, sources, discovery.skipped, statements, reviews)


@dataclass
class CarriedOver:
    """What an incremental load takes from the source's latest load instead of deriving it again."""

    tasks: list[Task] = field(default_factory=list)  # kept as stored: checked under the current policy
    to_check: list[Task] = field(default_factory=list)  # their original statements, for the current policy
    rejects: list[Problem] = field(default_factory=list)


def _statement_reject(problem: Problem) -> bool:
    return problem.field == "instruction" and "(statements: strict" in problem.reason


def carry_over(catalog: Catalog, source_key: str, result: LoadResult, statements: str = "flag") -> CarriedOver:
    """Take out of `result` the candidates (history commits) the source's latest load already processed,
    and return that load's outcome for them: its task, or its rejects (except infrastructure faults,
    which are tried again). Only commits new since the last load are then derived: the nightly
    refresh and the sensor cost what is new, not the whole range. Commits that left the range (a
    `last: N` window moving on, a rewritten branch) are not carried: the load stays the range's.

    A statement verdict belongs to the policy it was reached under: when `statements` is not the
    latest load's policy, carried tasks come back with their original statements to be checked again,
    and commits that policy rejected (strict) are derived again, since their tasks were never stored."""
    previous = catalog.latest_load(source_key)
    if previous is None:
        return CarriedOver()
    same_policy = previous.statements == statements
    by_commit = {t.spec.metadata.get("fix_commit"): t for t in previous.tasks}
    rejected: dict[str, list[Problem]] = {}
    for p in previous.rejects:
        sha12 = p.source.rsplit(":", 1)[-1]
        if not p.reason.startswith("infra:") and (same_policy or not _statement_reject(p)):
            rejected.setdefault(sha12, []).append(p)
    carried, todo = CarriedOver(), []
    for cand in result.candidates:
        sha = cand.metadata.get("fix_commit", "")
        if sha in by_commit:
            if same_policy:
                carried.tasks.append(by_commit[sha])
            else:
                carried.to_check.append(unchecked(by_commit[sha]))
        elif sha[:12] in rejected:
            carried.rejects.extend(rejected[sha[:12]])
        else:
            todo.append(cand)
    result.candidates = todo
    return carried


def _reject_ids_of_other_sources(owners: dict[str, list[tuple[str, str]]], result: LoadResult, key: str) -> None:
    """A task id already current from another source is a reject naming both, not a silent shadow."""
    kept = []
    for task in result.tasks:
        other = [(k, origin) for k, origin in owners.get(task.id, []) if k != key]
        if other:
            other_key, other_origin = other[0]
            result.rejects.append(
                Problem(
                    task.origin,
                    "id",
                    f"task id {task.id!r} is already current from source "
                    f"{other_key} ({other_origin}); ids are unique across "
                    "sources: rename one, or retire the other source",
                )
            )
        else:
            kept.append(task)
    result.tasks = kept
