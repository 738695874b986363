"""Difficulty tiers from pass@k of a reference policy, with a static fallback, and splits.

Tiers by the fraction of k samples solved (k = 8 by default):

| tier | solved | why it matters |
|---|---|---|
| `unsolved` | 0/k | no learning signal, and possibly a broken verifier: kept for audit, not trained on |
| `hard` | 1 .. 25% | the frontier: most GRPO signal per rollout |
| `medium` | 25% .. 75% | |
| `easy` | 75% .. below k/k | |
| `trivial` | k/k | every group has equal rewards, hence zero GRPO advantage |

Boundaries: `hard` is 0 < p <= 0.25, `medium` 0.25 < p < 0.75, `easy` 0.75 <= p < 1.

Without a policy, a static score orders tasks by how much they ask for (lines and files the
reference touches, tests to turn, checkpoints), cut into the same four solvable tiers by
quartile, marked `static` so nobody mistakes it for measured difficulty.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Collection, Iterable, Mapping, Sequence

from envforge.task import Task
from envforge.verify.protect import split_diff


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimator (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if n <= 0 or k <= 0:
        return 0.0
    k = min(k, n)
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def tier_for(solved: int, k: int) -> str:
    if k <= 0:
        raise ValueError("k must be positive")
    p = solved / k
    if solved == 0:
        return "unsolved"
    if solved == k:
        return "trivial"
    if p <= 0.25:
        return "hard"
    if p < 0.75:
        return "medium"
    return "easy"


@dataclass(frozen=True)
class TierRow:
    task_id: str
    content_hash: str
    source: str
    tier: str
    method: str  # "pass@k" or "static"
    solved: int
    k: int
    score: float  # pass rate, or the static difficulty score
    split: str = ""


def static_score(task: Task) -> float:
    """How much the task asks for, from its reference and checks (higher = harder)."""
    lines = files = 0
    if task.reference_patch:
        sections = split_diff(task.reference_patch)
        files = len(sections)
        lines = sum(
            1
            for s in sections
            for line in s.text.splitlines()
            if line[:1] in "+-" and not line.startswith(("+++", "---"))
        )
    else:
        cmds = task.spec.reference_solution.commands or []
        lines = sum(len(c.splitlines()) for c in cmds)
        files = len(cmds)
    tests = task.spec.verification.tests
    checks = (len(tests.fail_to_pass) if tests else 0) + len(task.spec.verification.checkpoints)
    return math.log1p(lines) + 0.5 * files + 0.25 * checks


def tiers_from_passes(tasks: Sequence[Task], solved: dict[str, tuple[int, int]]) -> list[TierRow]:
    """Rows from measured (solved, k) per task id; tasks without a measurement get static tiers."""
    measured = [t for t in tasks if t.id in solved]
    rows = [
        TierRow(
            t.id,
            t.content_hash,
            t.spec.source,
            tier_for(*solved[t.id]),
            "pass@k",
            solved[t.id][0],
            solved[t.id][1],
            solved[t.id][0] / solved[t.id][1],
        )
        for t in measured
    ]
    rest = [t for t in tasks if t.id not in solved]
    return rows + static_tiers(rest)


def static_tiers(tasks: Sequence[Task]) -> list[TierRow]:
    scored = sorted(((static_score(t), t.id, t) for t in tasks), key=lambda x: (x[0], x[1]))
    rows = []
    for i, (score, _, t) in enumerate(scored):
        q = i / max(1, len(scored))
        tier = "easy" if q < 0.25 else "medium" if q < 0.75 else "hard"
        rows.append(TierRow(t.id, t.content_hash, t.spec.source, tier, "static", 0, 0, round(score, 4)))
    return rows


def stratified_split(
    rows: Iterable[TierRow],
    eval_fraction: float = 0.2,
    seed: int = 0,
    groups: Mapping[str, str] | None = None,
    audit_only: Collection[str] = (),
) -> list[TierRow]:
    """Train/eval split stratified by (tier, source); unsolved tasks, and the content hashes in
    `audit_only` (verifiers the gate found too weak to train on), go to `audit`.

    `groups` maps a task id to its near-duplicate cluster (any key shared by the cluster's
    members; a task not in it is its own group). A group is placed whole: all its solvable
    members land in the same split, so no near-duplicate pair straddles train and eval.
    Groups are stratified by their first member's (tier, source).

    The eval set gets round(n * eval_fraction) groups overall (at least one when there are two
    or more), allotted to strata by largest remainder, so every stratum gets its share and
    small strata are not all rounded away; a stratum of two or more groups always keeps one
    for training. Within a stratum, groups are ordered by a seeded hash of their key. Without
    near duplicates every group is one task, and this is a per-task stratified split.
    """
    groups = groups or {}
    units: dict[str, list[TierRow]] = defaultdict(list)
    out = []
    for r in sorted(rows, key=lambda r: r.task_id):
        if r.tier == "unsolved" or r.content_hash in audit_only:
            out.append(TierRow(**{**r.__dict__, "split": "audit"}))
        else:
            units[groups.get(r.task_id, r.task_id)].append(r)
    strata: dict[tuple[str, str], list[str]] = defaultdict(list)
    for key, members in units.items():
        strata[(members[0].tier, members[0].source)].append(key)
    total = sum(len(v) for v in strata.values())
    target = round(total * eval_fraction) if eval_fraction > 0 else 0
    if eval_fraction > 0 and total >= 2:
        target = max(1, target)
    cap = {k: len(v) - 1 if len(v) >= 2 else len(v) for k, v in strata.items()}
    quota = {k: min(cap[k], int(len(v) * eval_fraction)) for k, v in strata.items()}
    by_remainder = sorted(
        strata,
        key=lambda k: (-(len(strata[k]) * eval_fraction - int(len(strata[k]) * eval_fraction)), -len(strata[k]), k),
    )
    while sum(quota.values()) < target and any(quota[k] < cap[k] for k in strata):
        for k in by_remainder:
            if sum(quota.values()) >= target:
                break
            if quota[k] < cap[k]:
                quota[k] += 1
    for stratum in sorted(strata):
        keys = sorted(strata[stratum], key=lambda key: hashlib.sha256(f"{seed}:{key}".encode()).hexdigest())
        for i, key in enumerate(keys):
            for r in units[key]:
                out.append(TierRow(**{**r.__dict__, "split": "eval" if i < quota[stratum] else "train"}))
    return sorted(out, key=lambda r: r.task_id)
