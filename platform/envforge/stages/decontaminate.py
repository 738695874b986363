"""Decontaminate: tasks against the reference corpora and against each other (and what is published)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from envforge.catalog import Catalog
from envforge.config import Settings
from envforge.quality.corpora import active_corpora
from envforge.quality.dedup import Cluster, ContaminationRecord, DuplicatePair, clusters, near_duplicate_pairs
from envforge.quality.dedup import decontaminate as contamination_records
from envforge.quality.params import DedupConfig
from envforge.quality.reference_index import ReferenceIndex, SyncReport
from envforge.quality.semantic import SemanticOutcome
from envforge.stages.base import StageContext, StageResult, stage
from envforge.task import Task

STATUSES = ("clean", "contaminated", "duplicate")


@dataclass
class DecontaminationResult(StageResult):
    """Decontamination and dedup of one batch of tasks: a verdict row per task (with the evidence of
    every field), and how the run went (the index's parameters, the semantic stage, warnings)."""

    records: list[ContaminationRecord]
    pairs: list[DuplicatePair]
    clusters: list[Cluster]
    rows: list[dict]
    sync: SyncReport
    chart: Path
    evidence_chart: Path
    config: DedupConfig  # as run: `index` is the parameters the reference index was built with
    semantic: SemanticOutcome = field(default_factory=SemanticOutcome)
    index_warnings: list[str] = field(default_factory=list)

    def kept_hashes(self) -> list[str]:
        return [r["content_hash"] for r in self.rows if r["status"] == "clean"]

    def removed(self) -> list[dict]:
        """The tasks this stage took out, with why (a task set's lineage keeps them)."""
        return [
            {"task_id": r["task_id"], "content_hash": r["content_hash"], "stage": r["status"], "reason": r["reason"]}
            for r in self.rows
            if r["status"] != "clean"
        ]

    def counts(self) -> dict[str, int]:
        return {s: sum(1 for r in self.rows if r["status"] == s) for s in STATUSES}

    def warnings(self) -> list[str]:
        """What a person should know about this run: decision rules the index cannot fully serve, and a
        semantic stage that was down (the exact stages decided alone)."""
        note = self.semantic.note()
        return self.index_warnings + ([note] if note else [])

    def params(self) -> dict[str, Any]:
        return {"n_tasks": len(self.rows)}

    def metrics(self) -> dict[str, float]:
        n = self.counts()
        return {
            "tasks_checked": len(self.rows),
            "tasks_clean": n["clean"],
            "tasks_contaminated": n["contaminated"],
            "tasks_duplicate": n["duplicate"],
            "duplicate_pairs": len(self.pairs),
            "index_docs_added": self.sync.added_docs,
            "semantic_available": float(self.semantic.status in ("ok", "off")),
        }

    def artifacts(self) -> dict[str, Any]:
        return {
            "contamination_report.json": self.rows,
            "dedup_run.json": {
                "semantic": self.semantic.as_dict(),
                "index_warnings": self.index_warnings,
                "sync": self.sync.as_dict(),
                "index": asdict(self.config.index_config),
            },
        }

    def charts(self) -> list[Path]:
        return [self.chart, self.evidence_chart]


@stage("decontaminate", tag="quality")
def decontaminate(
    settings: Settings,
    config: DedupConfig,
    tasks: Sequence[Task],
    corpora: dict[str, Path | None] | None = None,
    context: StageContext = StageContext(),
) -> DecontaminationResult:
    """Check tasks against the reference corpora and each other; record a verdict per task.

    `corpora` None: HumanEval, the registered corpora and ENVFORGE_CORPORA; the reference index is
    synced to hold exactly these. `config.index` None: the parameters the index was built with;
    index parameters that differ from the index's raise `IndexMismatch` (rebuild with
    `envforge dedup index --rebuild`).

    Tasks already in other task sets take part as `others`: a new task that near-duplicates
    one of them is the duplicate (what is published stays put).
    """
    from envforge.charts import evidence_strength_chart, similarity_histogram

    catalog = Catalog(settings.catalog_path)
    context.progress("decontaminate", "reference index", 0, 2)
    index = ReferenceIndex(settings.reference_index_dir, config.index)
    config = config.with_index(index.config)
    if corpora is None:
        corpora = active_corpora(settings.dedup_dir)
    sync = index.sync(corpora)
    records, semantic = contamination_records(tasks, index, config, corpora=list(corpora), data_dir=settings.data_dir)
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
    nearest: dict[str, DuplicatePair] = {}
    for p in pairs:
        for tid in (p.a, p.b):
            if tid not in nearest or p.exact_jaccard > nearest[tid].exact_jaccard:
                nearest[tid] = p
    rows = []
    for t, r in zip(tasks, records):
        status = "contaminated" if r.contaminated else "duplicate" if t.id in dup_of else "clean"
        reason = r.reason
        if status == "duplicate":
            p = nearest[t.id]
            reason = (
                f"near duplicate of {dup_of[t.id]} (exact Jaccard {p.exact_jaccard:.2f} and "
                f"{p.containment:.0%} of the smaller task's own text shared, boilerplate removed; "
                f"longest shared run {p.longest_shared_ngram} words); corpus check: {r.reason}"
            )
        rows.append(
            {
                "content_hash": t.content_hash,
                "task_id": t.id,
                "status": status,
                "corpus": r.corpus,
                "doc_id": r.doc_id,
                "est_jaccard": float(r.est_jaccard),
                "exact_jaccard": float(r.exact_jaccard),
                "longest_shared_ngram": int(r.longest_shared_ngram),
                "duplicate_of": dup_of.get(t.id),
                "nearest_task_jaccard": float(nearest[t.id].exact_jaccard) if t.id in nearest else 0.0,
                "reason": reason,
                "field": r.field,
                "evidence_json": json.dumps(r.details(semantic), sort_keys=True),
            }
        )
    if rows:
        catalog.record_quality(rows, config.as_params())
    chart = similarity_histogram(
        [r["exact_jaccard"] for r in rows],
        [r["nearest_task_jaccard"] for r in rows],
        config.threshold,
        settings.charts_dir / "similarity_histogram.png",
    )
    evidence_chart = evidence_strength_chart(
        [{"field": e.field, "strength": e.strength, "flagged": e.flagged} for r in records for e in r.evidence],
        settings.charts_dir / "contamination_evidence.png",
    )
    context.progress("decontaminate", "done", 2, 2)
    return DecontaminationResult(
        records, pairs, cl, rows, sync, chart, evidence_chart, config, semantic, config.index_warnings()
    )
