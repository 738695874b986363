"""Contamination records for tasks, near-duplicate clusters, and leak-free splits.

Rules (documented in docs/dedup.md):
- a task is contaminated when any of its fields (instruction, workspace files, reference
  solution, tests, verifier files) is confirmed against a reference document: exact Jaccard at
  or above the threshold, a shared word run of `verbatim_ngram` words (8 for short texts), a
  shared masked-prose run of as many words, or a shared normalized-code run of `code_run`
  tokens; or, with the semantic stage on, a paraphrase it confirms. Contaminated tasks leave
  the task set but stay in the catalog with the evidence of every field;
- near-duplicate tasks are compared on what makes each one itself, boilerplate removed, and
  form clusters (connected components of confirmed pairs); each cluster keeps one
  representative: the task with the most verification (required tests + checkpoints), then
  the longest instruction, then the smallest task id;
- splits place a cluster whole, never task by task, so no near-duplicate pair can straddle
  train and eval (`cluster_keys` feeds envforge.rollout.tiers.stratified_split).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from dataclasses import field as _field  # records have a `field` attribute
from pathlib import Path
from typing import Sequence

import numpy as np

from envforge.quality.boilerplate import boilerplate_shingles, own_shingles
from envforge.quality.fields import FieldText, WorkspaceReader, dedup_text, task_fields
from envforge.quality.fingerprint import longest_shared_run
from envforge.quality.minhash import exact_jaccard
from envforge.quality.params import DedupConfig
from envforge.quality.reference_index import Candidate, QueryText, ReferenceIndex
from envforge.quality.semantic import SemanticHit, SemanticOutcome, run_semantic
from envforge.quality.text import tokens
from envforge.task import Task

MAX_FLAGGED_PER_FIELD = 5


@dataclass(frozen=True)
class Evidence:
    """The best match of one field (or one file of it) against one reference document."""

    field: str
    path: str | None
    corpus: str
    doc_id: str
    flagged: bool
    strength: float  # >= 1 exactly when flagged
    detail: str  # the strongest rule in words, with the shared run
    exact_jaccard: float = 0.0
    est_jaccard: float = 0.0
    runs: dict[str, list[int]] = _field(default_factory=dict)  # view -> [run, needed]
    proposed_by: tuple[str, ...] = ()  # lsh, ngram, semantic
    semantic: dict | None = None  # cosine, decided_by, judge verdict

    @property
    def label(self) -> str:
        return f"{self.field}:{self.path}" if self.path else self.field

    def sentence(self) -> str:
        return f"{self.label} ~ {self.corpus}/{self.doc_id}: {self.detail}"

    def as_dict(self) -> dict:
        return asdict(self)


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
    field: str | None = None  # the field of the strongest evidence
    evidence: tuple[Evidence, ...] = ()
    workspace: dict = _field(default_factory=dict)  # what the workspace scan read and skipped

    def details(self, semantic: SemanticOutcome | None = None) -> dict:
        return {
            "evidence": [e.as_dict() for e in self.evidence],
            "workspace": self.workspace,
            "semantic": semantic.as_dict() if semantic is not None else {"status": "off"},
        }


def _exact_evidence(item: FieldText, c: Candidate) -> Evidence:
    m = c.match
    return Evidence(
        item.field,
        item.path,
        c.corpus,
        c.doc_id,
        m.flagged,
        round(m.strength, 4),
        m.describe(),
        m.exact_jaccard,
        c.est_jaccard,
        {r.view: [r.run, r.needed] for r in m.runs},
        c.proposed_by,
    )


def _semantic_evidence(item: FieldText, hit: SemanticHit, config: DedupConfig) -> Evidence:
    if hit.decided_by == "judge":
        verdict = hit.judge or {}
        detail = (
            f"judge ({verdict.get('model')}, {verdict.get('prompt_version')}): {verdict.get('verdict')}: "
            f"{verdict.get('rationale', '')} (cosine {hit.cosine:.2f})"
        )
        strength = 1.0 if hit.flagged else hit.cosine / config.semantic.flag_cosine * 0.99
    else:
        need = config.semantic.flag_cosine
        detail = f"embedding cosine {hit.cosine:.2f}" + (f" >= {need}" if hit.flagged else f" (flags at {need})")
        strength = hit.cosine / need
    return Evidence(
        item.field,
        item.path,
        hit.corpus,
        hit.doc_id,
        hit.flagged,
        round(strength, 4),
        detail,
        proposed_by=("semantic",),
        semantic=hit.as_dict(),
    )


def _rank(e: Evidence) -> tuple:
    return (e.flagged, e.strength)


def _select(evidence: list[Evidence]) -> tuple[Evidence, ...]:
    """Per field: its best evidence, and every flagged file up to a few."""
    by_field: dict[str, list[Evidence]] = {}
    for e in evidence:
        by_field.setdefault(e.field, []).append(e)
    out = []
    for items in by_field.values():
        items.sort(key=_rank, reverse=True)
        flagged = [e for e in items if e.flagged][:MAX_FLAGGED_PER_FIELD]
        out += flagged or items[:1]
    return tuple(sorted(out, key=_rank, reverse=True))


def _reason(flagged: list[Evidence], strongest: Evidence | None, docs: int, note: str) -> str:
    if flagged:
        others = sorted({e.label for e in flagged[1:]})
        why = f"{flagged[0].sentence()}"
        if others:
            why += f" (also flagged: {', '.join(others[:6])}{' ...' if len(others) > 6 else ''})"
    elif strongest is not None:
        why = f"clean; strongest evidence: {strongest.sentence()}"
    else:
        why = f"clean; no candidate among {docs} reference documents"
    return f"{why}; {note}" if note else why


def decontaminate(
    tasks: Sequence[Task],
    index: ReferenceIndex,
    config: DedupConfig | None = None,
    corpora: Sequence[str] | None = None,
    data_dir: Path | None = None,
) -> tuple[list[ContaminationRecord], SemanticOutcome]:
    """One record per task: every field compared, the evidence of each, the verdict.

    `corpora`: only these corpora's documents count (None: all the index holds). `data_dir`:
    history tasks' workspaces are read from its commit store when it holds them.
    """
    config = (config or DedupConfig()).with_index(index.config)
    reader = WorkspaceReader(config.workspace, data_dir)
    per_task = [task_fields(t, reader) for t in tasks]
    keys: dict[str, int] = {}
    queries: list[QueryText] = []
    first_item: list[FieldText] = []
    for items, _ in per_task:
        for it in items:
            if it.key not in keys:
                keys[it.key] = len(queries)
                queries.append(QueryText(it.text, it.python))
                first_item.append(it)
    allowed = set(corpora) if corpora is not None else None
    best: dict[int, list[Candidate]] = {}
    for c in index.search(queries, config, allowed):
        best.setdefault(c.query, []).append(c)
    semantic = SemanticOutcome()
    if config.semantic.enabled:
        picked = [i for i, it in enumerate(first_item) if it.field in config.semantic.fields]
        semantic = run_semantic(
            index, [queries[i].text for i in picked], [first_item[i].label for i in picked], config.semantic, allowed
        )
        semantic.hits = [
            SemanticHit(picked[h.query], h.corpus, h.doc_id, h.cosine, h.flagged, h.decided_by, h.judge)
            for h in semantic.hits
        ]
    sem_by_query: dict[int, list[SemanticHit]] = {}
    for h in semantic.hits:
        sem_by_query.setdefault(h.query, []).append(h)
    note = semantic.note()
    out = []
    for t, (items, scan) in zip(tasks, per_task):
        evidence: list[Evidence] = []
        for it in items:
            q = keys[it.key]
            cands = best.get(q, [])
            if cands:
                top = max(cands, key=lambda c: (c.match.flagged, c.match.strength))
                evidence.append(_exact_evidence(it, top))
            evidence += [_semantic_evidence(it, h, config) for h in sem_by_query.get(q, [])]
        chosen = _select(evidence)
        flagged = [e for e in chosen if e.flagged]
        strongest = chosen[0] if chosen else None
        runs = strongest.runs.get("text", [0])[0] if strongest else 0
        out.append(
            ContaminationRecord(
                t.id,
                t.content_hash,
                bool(flagged),
                strongest.corpus if strongest else None,
                strongest.doc_id if strongest else None,
                strongest.est_jaccard if strongest else 0.0,
                strongest.exact_jaccard if strongest else 0.0,
                runs,
                _reason(flagged, strongest, index.size, note),
                strongest.field if strongest else None,
                chosen,
                scan.as_dict(),
            )
        )
    return out, semantic


# -- task vs task ------------------------------------------------------------------------------

MIN_CONTAINED_SHINGLES = 20
_MAX_GROUP = 64  # a shingle shared by more tasks than this proposes no pairs (it is boilerplate)


@dataclass(frozen=True)
class DuplicatePair:
    a: str
    b: str
    exact_jaccard: float  # on the tasks' own text, boilerplate removed
    longest_shared_ngram: int
    containment: float = 0.0  # share of the smaller task's own shingles found in the other


def _pairs_sharing(own: list[np.ndarray]) -> np.ndarray:
    """(k, 2) index pairs i < j of sets that share at least one value (values in few sets)."""
    lengths = np.fromiter((len(s) for s in own), dtype=np.int64, count=len(own))
    if lengths.sum() == 0:
        return np.zeros((0, 2), np.int64)
    flat = np.concatenate(own)
    owner = np.repeat(np.arange(len(own)), lengths)
    order = np.lexsort((owner, flat))
    flat, owner = flat[order], owner[order]
    starts = np.flatnonzero(np.r_[True, flat[1:] != flat[:-1]])
    sizes = np.diff(np.r_[starts, len(flat)])
    group_size = np.repeat(sizes, sizes)
    found = []
    for d in range(1, min(_MAX_GROUP, int(sizes.max()))):
        i = np.arange(len(flat) - d)
        same = (flat[i] == flat[i + d]) & (group_size[i] <= _MAX_GROUP)
        if not same.any():
            break
        found.append(np.stack([owner[i[same]], owner[i[same] + d]], axis=1))
    if not found:
        return np.zeros((0, 2), np.int64)
    pairs = np.concatenate(found)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    pairs.sort(axis=1)
    return np.unique(pairs, axis=0)


def distinct_block(a: np.ndarray, b_shingles: np.ndarray, n: int) -> int:
    """The longest run of `a`'s words covered by no shingle (word n-gram, from `a`'s shingle
    sequence) that the other text also has: what one task says that the other does not."""
    if len(a) < n:
        return len(a) if not np.isin(a, b_shingles).any() else 0
    shared = np.flatnonzero(np.isin(a, b_shingles))
    depth = np.zeros(len(a) + n, dtype=np.int64)
    np.add.at(depth, shared, 1)
    np.add.at(depth, shared + n, -1)
    covered = np.cumsum(depth)[: len(a) + n - 1] > 0
    free = np.r_[0, (~covered).astype(np.int8), 0]
    edges = np.flatnonzero(np.diff(free))
    return int((edges[1::2] - edges[::2]).max()) if len(edges) else 0


def near_duplicate_pairs(
    tasks: Sequence[Task], others: Sequence[Task] = (), config: DedupConfig = DedupConfig()
) -> list[DuplicatePair]:
    """Confirmed near-duplicate pairs within `tasks`, and between `tasks` and `others`.

    Shingles shared by `boilerplate_min_tasks` or more of all these tasks are left out first;
    then every pair sharing any remaining shingle is compared exactly: duplicates when their
    Jaccard reaches the threshold, or when the smaller one's own text is contained in the
    other; unless each holds a run of `dedup_distinct_words` words the other lacks (two
    different tasks behind one template intro, which too few tasks share to be recognised).
    """
    hasher = config.hasher()
    ids = {t.id for t in tasks}
    pool = list(tasks) + [o for o in others if o.id not in ids]
    texts = [dedup_text(t) for t in pool]
    sets = [hasher.shingle_hashes(x) for x in texts]
    seqs: dict[int, np.ndarray] = {}

    def seq(i: int) -> np.ndarray:
        if i not in seqs:
            seqs[i] = hasher.shingle_sequence(hasher.word_hashes(tokens(texts[i])))
        return seqs[i]

    boiler = boilerplate_shingles(sets, max(2, config.boilerplate_min_tasks))
    own = [own_shingles(s, boiler) for s in sets]
    out = []
    for i, j in _pairs_sharing(own).tolist():
        if i >= len(tasks) and j >= len(tasks):
            continue  # two published tasks: not this batch's business
        a, b = own[i], own[j]
        jac = exact_jaccard(a, b)
        inter = len(np.intersect1d(a, b, assume_unique=True))
        smaller = min(len(a), len(b))
        contained = inter / smaller if smaller else 0.0
        if jac >= config.threshold or (smaller >= MIN_CONTAINED_SHINGLES and contained >= config.dedup_containment):
            n = hasher.ngram
            if (
                min(distinct_block(seq(i), np.unique(seq(j)), n), distinct_block(seq(j), np.unique(seq(i)), n))
                >= config.dedup_distinct_words
            ):
                continue
            run = longest_shared_run(hasher.word_hashes(tokens(texts[i])), hasher.word_hashes(tokens(texts[j])))
            x, y = (i, j) if i < len(tasks) else (j, i)  # a batch task first
            out.append(DuplicatePair(pool[x].id, pool[y].id, round(jac, 6), run.length, round(contained, 4)))
    return sorted(out, key=lambda p: (p.a, p.b))


@dataclass
class Cluster:
    members: list[str]
    representative: str
    pairs: list[DuplicatePair] = _field(default_factory=list)


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


def straddling_pairs(
    splits: dict[str, str], pairs: Sequence[DuplicatePair], sides: tuple[str, str] = ("train", "eval")
) -> list[DuplicatePair]:
    """The pairs with one task on each side: near duplicates a model is trained on and evaluated on."""
    return [p for p in pairs if {splits.get(p.a), splits.get(p.b)} == set(sides)]
