"""Decontaminate: tasks against the reference corpora and against each other (and what is published)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from envforge.catalog import Catalog
from envforge.config import Settings
from envforge.quality.corpora import corpora_from_env
from envforge.quality.dedup import Cluster, ContaminationRecord, DuplicatePair, clusters, near_duplicate_pairs
from envforge.quality.dedup import decontaminate as contamination_records
from envforge.quality.params import DedupConfig
from envforge.quality.reference_index import ReferenceIndex, SyncReport
from envforge.stages.base import StageContext, StageResult, stage
from envforge.task import Task

STATUSES = ("clean", "contaminated", "duplicate")


@dataclass
class DecontaminationResult(StageResult):
    """Decontamination and dedup of one batch of tasks: a verdict row per task."""

    records: list[ContaminationRecord]
    pairs: list[DuplicatePair]
    clusters: list[Cluster]
    rows: list[dict]
    sync: SyncReport
    chart: Path

    def kept_hashes(self) -> list[str]:
        return [r["content_hash"] for r in self.rows if r["status"] == "clean"]

    def removed(self) -> list[dict]:
        """The tasks this stage took out, with why (a task set's lineage keeps them)."""
        return [{"task_id": r["task_id"], "content_hash": r["content_hash"], "stage": r["status"],
                 "reason": r["reason"]} for r in self.rows if r["status"] != "clean"]

    def counts(self) -> dict[str, int]:
        return {s: sum(1 for r in self.rows if r["status"] == s) for s in STATUSES}

    def params(self) -> dict[str, Any]:
        return {"n_tasks": len(self.rows)}

    def metrics(self) -> dict[str, float]:
        n = self.counts()
        return {"tasks_checked": len(self.rows), "tasks_clean": n["clean"], "tasks_contaminated": n["contaminated"],
                "tasks_duplicate": n["duplicate"], "duplicate_pairs": len(self.pairs),
                "index_docs_added": self.sync.added_docs}

    def artifacts(self) -> dict[str, Any]:
        return {"contamination_report.json": self.rows}

    def charts(self) -> list[Path]:
        return [self.chart]


@stage("decontaminate", tag="quality")
def decontaminate(settings: Settings, config: DedupConfig, tasks: Sequence[Task],
                  corpora: dict[str, Path | None] | None = None,
                  context: StageContext = StageContext()) -> DecontaminationResult:
    """Check tasks against the reference corpora (default: HumanEval + ENVFORGE_CORPORA) and each
    other; record a verdict per task.

    Tasks already in other task sets take part as `others`: a new task that near-duplicates
    one of them is the duplicate (what is published stays put).
    """
    from envforge.charts import similarity_histogram

    catalog = Catalog(settings.catalog_path)
    context.progress("decontaminate", "reference index", 0, 2)
    index = ReferenceIndex(settings.reference_index_dir, config)
    sync = index.sync(corpora if corpora is not None else corpora_from_env())
    records = contamination_records(tasks, index)
    clean = [t for t, r in zip(tasks, records) if not r.contaminated]
    batch_ids = {t.id for t in tasks}
    published = set(catalog.published_hashes())
    others = [t for t in catalog.load_tasks() if t.content_hash in published and t.id not in batch_ids]
    context.progress("decontaminate", "near duplicates", 1, 2)
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
    chart = similarity_histogram([r["exact_jaccard"] for r in rows], [r["nearest_task_jaccard"] for r in rows],
                                 config.threshold, settings.charts_dir / "similarity_histogram.png")
    context.progress("decontaminate", "done", 2, 2)
    return DecontaminationResult(records, pairs, cl, rows, sync, chart)
