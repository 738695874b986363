"""The statement check applied to a source's tasks at ingest, under a policy.

`strict`: a statement still flagged after its repair keeps the task out (a reject naming the
record's `instruction` and the findings, so nothing is lost). `flag`: the task is kept, with the
repaired text where the repair changed it and its verdict in the metadata, so the catalog, the
task-set card and the run report can show and count it. `off`: tasks go through untouched.

The verdict travels in `task.spec.metadata["statement"]` (verdict, findings with evidence, what
the repair took care of, what cleaning removed, the original text when it changed), which is part
of the task's content: a task whose statement was repaired is a new version of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from envforge.errors import Problem
from envforge.quality.fields import WorkspaceReader, WorkspaceScan
from envforge.quality.statement_config import StatementReviewConfig
from envforge.quality.statement_review import ReviewOutcome, review_statements
from envforge.quality.statements import (
    StatementCheck,
    StatementContext,
    StatementPolicy,
    StatementSummary,
    repair_statement,
)
from envforge.task import Task


@dataclass
class StatementOutcome:
    """What the policy made of a batch of tasks."""

    tasks: list[Task] = field(default_factory=list)
    rejects: list[Problem] = field(default_factory=list)
    checks: dict[str, StatementCheck] = field(default_factory=dict)  # task id -> its check
    summary: StatementSummary = field(default_factory=StatementSummary)
    review: ReviewOutcome = field(default_factory=ReviewOutcome)


def with_statement(task: Task, check: StatementCheck, review: dict | None = None, text: str | None = None) -> Task:
    """The task carrying the check's text (or an accepted rewrite's) and verdict (a new content hash)."""
    record = check.as_json()
    text = check.statement if text is None else text
    if text != task.spec.instruction:
        record["original"] = task.spec.instruction
    if review is not None:
        record["review"] = review
    spec = task.spec.model_copy(update={"instruction": text, "metadata": {**task.spec.metadata, "statement": record}})
    updated = task.model_copy(update={"spec": spec})
    return updated.model_copy(update={"content_hash": updated.compute_content_hash()})


def unchecked(task: Task) -> Task:
    """The task as its source gave it: the original statement back and no verdict, so a policy other than
    the one it was checked under can judge it afresh (an incremental load carrying tasks over)."""
    record = task.spec.metadata.get("statement")
    if record is None:
        return task
    metadata = {k: v for k, v in task.spec.metadata.items() if k != "statement"}
    spec = task.spec.model_copy(
        update={"instruction": record.get("original", task.spec.instruction), "metadata": metadata}
    )
    updated = task.model_copy(update={"spec": spec})
    return updated.model_copy(update={"content_hash": updated.compute_content_hash()})


def apply_statement_policy(
    tasks: list[Task],
    policy: StatementPolicy,
    data_dir: Path | None = None,
    reader: WorkspaceReader | None = None,
    review: StatementReviewConfig | None = None,
) -> StatementOutcome:
    """Check and repair every task's statement; with a review endpoint, have a model rate the kept ones
    (and rewrite them, when asked); keep, mark or reject each by the policy."""
    outcome = StatementOutcome()
    if policy == "off":
        outcome.tasks = list(tasks)
        return outcome
    reader = reader or WorkspaceReader(WorkspaceScan(), data_dir)
    kept: list[tuple[Task, StatementContext]] = []
    for task in tasks:
        try:
            workspace, _ = reader.files(task)
        except (OSError, ValueError):
            workspace = []  # a workspace that cannot be read only weakens the identifier rule
        context = StatementContext.of_task(task, workspace)
        check = repair_statement(task.spec.instruction, context)
        outcome.checks[task.id] = check
        outcome.summary.add(check)
        if policy == "strict" and check.verdict == "flagged":
            outcome.rejects.append(Problem(task.origin, "instruction", f"{check.reason()} (statements: strict)"))
            continue
        kept.append((task, context))
    review = review or StatementReviewConfig()
    if review.url:
        shown = [
            (
                t.model_copy(
                    update={"spec": t.spec.model_copy(update={"instruction": outcome.checks[t.id].statement})}
                ),
                c,
            )
            for t, c in kept
        ]
        outcome.review = review_statements(
            shown, review, {t.id: outcome.checks[t.id].verdict == "flagged" for t, _ in kept}
        )
    for task, _ in kept:
        check, rating = outcome.checks[task.id], outcome.review.reviews.get(task.id)
        if rating is not None and review.enforce and policy == "strict" and rating.bad:
            outcome.rejects.append(
                Problem(
                    task.origin,
                    "instruction",
                    f"model review: underspecified "
                    f"{rating.underspecified}/3, test validity {rating.test_validity}/3: "
                    f"{rating.rationale} (statements: strict, review.enforce)",
                )
            )
            continue
        text = rating.rewrite if rating is not None and rating.rewrite_accepted else None
        outcome.tasks.append(with_statement(task, check, rating.as_json() if rating is not None else None, text))
    return outcome


def statement_verdicts(tasks: list[Task]) -> dict[str, dict]:
    """Each task's recorded verdict and findings (`unchecked` for tasks ingested with the policy off or
    before statements were checked), for the catalog listing, the task-set card and the Dagster check."""
    out = {}
    for task in tasks:
        record = task.spec.metadata.get("statement") or {}
        out[task.id] = {
            "verdict": record.get("verdict", "unchecked"),
            "findings": [f"{f['rule']}: {f['evidence']}" for f in record.get("findings", [])],
            "repaired": [f"{f['rule']}: {f['evidence']}" for f in record.get("repaired", [])],
        }
    return out


__all__ = ["StatementOutcome", "apply_statement_policy", "statement_verdicts", "unchecked", "with_statement"]
