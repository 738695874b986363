"""Contamination records for tasks, near-duplicate clusters, and leak-free splits.

Rules (documented in docs/dedup.md):
- a task is contaminated when its best-matching reference document has exact Jaccard at or
  above the threshold, or shares a verbatim word run of `verbatim_ngram` words (8 for
  short texts); contaminated tasks leave the task set but stay in the catalog with the match;
- near-duplicate tasks form clusters (connected components of confirmed pairs); each
  cluster keeps one representative: the task with the most verification (required tests +
  checkpoints), then the longest instruction, then the smallest task id;
- splits place a cluster whole, never task by task, so no near-duplicate pair can straddle
  train and eval (`cluster_keys` feeds envforge.rollout.tiers.stratified_split).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from envforge.quality.confirm import confirm
from envforge.quality.lsh import BandIndex
from envforge.quality.params import DedupConfig
from envforge.quality.reference_index import ReferenceIndex
from envforge.quality.text import task_text
from envforge.task import Task


@dataclass(frozen=True)
class ContaminationRecord:
    task_id: str
    content_hash: str
    contaminated: bool
    corpus: str | None = None
    doc_id: str | None = None
    est_jaccard: float = 0.0
    exact_jaccard: float = 0.0
    longest_shared_ngram: int = 0
    reason: str = ""


def decontaminate(tasks: Sequence[Task], index: ReferenceIndex) -> list[ContaminationRecord]:
    """One record per task: its best confirmed match in the reference index, if any."""
    texts = [task_text(t) for t in tasks]
    best: dict[int, object] = {}
    for cand in index.search(texts):
        cur = best.get(cand.query)
        key = (cand.match.flagged, cand.match.exact_jaccard, cand.match.longest_shared_ngram)
        if cur is None or key > (cur.match.flagged, cur.match.exact_jaccard, cur.match.longest_shared_ngram):
            best[cand.query] = cand
    out = []
    for i, t in enumerate(tasks):
        c = best.get(i)
        if c is None:
            out.append(ContaminationRecord(t.id, t.content_hash, False))
            continue
        m = c.match
        why = []
        if m.near_duplicate:
            why.append(f"exact Jaccard {m.exact_jaccard:.2f} >= {index.config.threshold}")
        if m.verbatim:
            why.append(f"verbatim run of {m.longest_shared_ngram} words")
        out.append(ContaminationRecord(t.id, t.content_hash, m.flagged, c.corpus, c.doc_id, c.est_jaccard,
                                       m.exact_jaccard, m.longest_shared_ngram,
                                       f"matches {c.corpus}/{c.doc_id}: " + ", ".join(why) if why else ""))
    return out


@dataclass(frozen=True)
class DuplicatePair:
    a: str
    b: str
    exact_jaccard: float
    longest_shared_ngram: int


def near_duplicate_pairs(tasks: Sequence[Task], others: Sequence[Task] = (),
                         config: DedupConfig = DedupConfig()) -> list[DuplicatePair]:
    """Confirmed near-duplicate pairs within `tasks`, and between `tasks` and `others`."""
    hasher = config.hasher()
    pool = list(tasks) + [o for o in others if o.id not in {t.id for t in tasks}]
    texts = [task_text(t) for t in pool]
    sigs = hasher.signatures(texts)
    bands, rows = config.banding()
    index = BandIndex(bands, rows)
    index.add(sigs)
    qs, ds = index.query(sigs[: len(tasks)])
    pairs = []
    for q, d in zip(qs.tolist(), ds.tolist()):
        if d <= q and d < len(tasks):
            continue  # each within-set pair once, and never a task with itself
        m = confirm(config, texts[q], texts[d], hasher)
        if m.flagged:
            pairs.append(DuplicatePair(pool[q].id, pool[d].id, m.exact_jaccard, m.longest_shared_ngram))
    return sorted(pairs, key=lambda p: (p.a, p.b))


@dataclass
class Cluster:
    members: list[str]
    representative: str
    pairs: list[DuplicatePair] = field(default_factory=list)


def _weight(task: Task) -> tuple:
    v = task.spec.verification
    checks = (len(v.tests.ids) if v.tests else 0) + len(v.checkpoints)
    return (-checks, -len(task.spec.instruction), task.id)


def clusters(tasks: Sequence[Task], pairs: Sequence[DuplicatePair]) -> list[Cluster]:
    """Connected components of the pair graph (tasks only; singletons omitted)."""
    ids = {t.id for t in tasks}
    parent = {t.id: t.id for t in tasks}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for p in pairs:
        if p.a in ids and p.b in ids:
            parent[find(p.a)] = find(p.b)
    groups: dict[str, list[str]] = {}
    for t in tasks:
        groups.setdefault(find(t.id), []).append(t.id)
    by_id = {t.id: t for t in tasks}
    out = []
    for members in groups.values():
        if len(members) < 2:
            continue
        rep = min(members, key=lambda m: _weight(by_id[m]))
        inside = [p for p in pairs if p.a in members and p.b in members]
        out.append(Cluster(sorted(members), rep, inside))
    return sorted(out, key=lambda c: c.representative)


def cluster_keys(tasks: Sequence[Task], pairs: Sequence[DuplicatePair]) -> dict[str, str]:
    """task id -> the representative of its near-duplicate cluster (tasks without one are left out);
    the `groups` a split keeps together (envforge.rollout.tiers.stratified_split)."""
    return {m: c.representative for c in clusters(tasks, pairs) for m in c.members}


def straddling_pairs(splits: dict[str, str], pairs: Sequence[DuplicatePair],
                     sides: tuple[str, str] = ("train", "eval")) -> list[DuplicatePair]:
    """The pairs with one task on each side: near duplicates a model is trained on and evaluated on."""
    return [p for p in pairs if {splits.get(p.a), splits.get(p.b)} == set(sides)]
