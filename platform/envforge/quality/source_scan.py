"""What a dry run of sources shows (`envforge sources scan`): each record and what it would become, without a sandbox.

Tasks (specs, runbooks, SWE-bench instances) are ready as they are; candidates (tickets, reviews,
history commits) would have their tests derived at ingest; skipped commits and rejects say why.
Each task and candidate says where its environment's packages come from (declared, or the manifests
and CI jobs inference read them from) and gets the statement check's verdict as far as it can be known
before derivation (without the failure the tests will show, so a bare title stays flagged here
and may be repaired at ingest).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from envforge.quality.fields import WorkspaceReader, WorkspaceScan
from envforge.quality.statements import StatementContext, repair_statement
from envforge.sources.discover import SourceRef
from envforge.sources.result import LoadResult
from envforge.task import Task


def _statement(task: Task, reader: WorkspaceReader) -> tuple[str, list[str]]:
    try:
        workspace, _ = reader.files(task)
    except (OSError, ValueError):
        workspace = []
    check = repair_statement(task.spec.instruction, StatementContext.of_task(task, workspace))
    return check.verdict, [f"{f.rule}: {f.evidence}" for f in check.findings]


def environment_from(task: Task) -> str:
    """Where the task's packages come from: `declared`, or the files and CI jobs inference read them from
    (`metadata.environment.inferred.from`), `-` when the source says nothing about it."""
    about = task.spec.metadata.get("environment")
    if not isinstance(about, dict):
        return "-"
    if about.get("declared"):
        return "declared"
    found = (about.get("inferred") or {}).get("from") or []
    return "inferred from " + ", ".join(found) if found else "inferred: nothing found"


def scan_rows(loaded: Sequence[tuple[SourceRef, LoadResult]], data_dir: Path | None = None) -> list[dict[str, Any]]:
    """One row per record: source, kind, record, what it becomes, why (skips and rejects), statement verdict."""
    reader = WorkspaceReader(WorkspaceScan(), data_dir)
    rows: list[dict[str, Any]] = []
    for ref, res in loaded:
        source = str(ref.path)
        for task in res.tasks:
            verdict, findings = _statement(task, reader)
            rows.append(
                {
                    "source": source,
                    "kind": ref.kind,
                    "record": task.origin,
                    "becomes": "task",
                    "reason": "",
                    "statement": verdict,
                    "findings": findings,
                    "environment": environment_from(task),
                }
            )
        for cand in res.candidates:
            provisional = cand.provisional_task()
            verdict, findings = _statement(provisional, reader)
            helpers = cand.change.support_files
            rows.append(
                {
                    "source": source,
                    "kind": ref.kind,
                    "record": cand.origin,
                    "becomes": "candidate",
                    "reason": "tests derived at ingest (FAIL_TO_PASS by running the suite before and after)"
                    + (f"; test helpers held back with the tests: {', '.join(helpers)}" if helpers else ""),
                    "statement": verdict,
                    "findings": findings,
                    "environment": environment_from(provisional),
                }
            )
        for kind, problems in (("skipped", res.skipped), ("rejected", res.rejects)):
            for p in problems:
                rows.append(
                    {
                        "source": source,
                        "kind": ref.kind,
                        "record": p.source,
                        "becomes": kind,
                        "reason": f"{p.field}: {p.reason}" if p.field else p.reason,
                        "statement": "-",
                        "findings": [],
                        "environment": "-",
                    }
                )
    return rows


__all__ = ["environment_from", "scan_rows"]
