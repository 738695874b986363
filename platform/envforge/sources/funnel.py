"""Yield you can see: what a source's records became, stage by stage, and whose fault each loss is.

A team that points envforge at its history wants to know two things about the rejects: which
stage lost each record, and whether the record was at fault (a refactor with no failing test) or
envforge was (an environment it could not build, a suite it could not collect, an engine fault).
Only the second kind is worth a bug report; a reject rate that hides it teaches nobody anything.
`classify` reads a reject's field and reason, which derivation and the parsers write in a fixed
form, and `Funnel` counts candidates -> environment built -> derived -> statement kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from envforge.errors import Problem

# (pattern on the reason, stage, owner): the first match decides. Owner "envforge" means the
# environment or the harness failed the record, "record" that the record itself is unusable.
_RULES: tuple[tuple[str, str, str], ...] = (
    (r"^infra:", "derive", "envforge"),
    (r"ran out of memory", "environment", "envforge"),  # the sandbox's memory limit, not the commit
    (r"tests could not be collected", "derive", "envforge"),
    (r"produced no results after the change", "derive", "envforge"),
    (r"does not apply to its own parent", "derive", "record"),
    (r"no failing-then-passing test", "derive", "record"),
    (r"^statement flagged|model review:", "statement", "record"),
    (r"changes no test files|changes only tests|root commit", "parse", "record"),
)


@dataclass(frozen=True)
class Loss:
    stage: str  # parse | environment | derive | statement
    owner: str  # envforge | record
    reason: str


def classify(problem: Problem) -> Loss:
    """The stage that lost a record and whose fault it was, from the reject's field and reason."""
    for pattern, stage, owner in _RULES:
        if re.search(pattern, problem.reason):
            return Loss(stage, owner, _reason_key(problem.reason))
    if problem.field == "environment":  # an env layer or task image that did not build
        return Loss("environment", "envforge", _reason_key(problem.reason))
    return Loss("parse", "record", _reason_key(problem.reason))


def _reason_key(reason: str) -> str:
    """A reason without its specifics (ids, paths, numbers), so rejects group by what went wrong."""
    head = re.split(r"[:;(]", reason, maxsplit=1)[0].strip()
    return re.sub(r"\d+", "N", head)[:80] or reason[:80]


@dataclass
class Funnel:
    """Counts of one source's (or a run's) records through the stages."""

    candidates: int = 0  # records that became a task or a candidate (tasks count here and in every later stage)
    environment_built: int = 0
    derived: int = 0
    accepted: int = 0  # kept after the statement check
    skipped: int = 0  # looked at and left out on purpose (history filters)
    lost: dict[str, int] = field(default_factory=dict)  # "<stage>/<owner>" -> count
    reasons: dict[str, int] = field(default_factory=dict)  # "<stage>/<owner>: <reason>" -> count

    @classmethod
    def of(cls, tasks: int, rejects: Iterable[Problem], skipped: int = 0) -> "Funnel":
        losses = [classify(p) for p in rejects]
        funnel = cls(skipped=skipped)
        env_lost = sum(1 for x in losses if x.stage == "environment")
        derive_lost = sum(1 for x in losses if x.stage == "derive")
        statement_lost = sum(1 for x in losses if x.stage == "statement")
        funnel.accepted = tasks
        funnel.derived = tasks + statement_lost
        funnel.environment_built = funnel.derived + derive_lost
        funnel.candidates = funnel.environment_built + env_lost
        for x in losses:
            key = f"{x.stage}/{x.owner}"
            funnel.lost[key] = funnel.lost.get(key, 0) + 1
            funnel.reasons[f"{key}: {x.reason}"] = funnel.reasons.get(f"{key}: {x.reason}", 0) + 1
        return funnel

    @property
    def envforge_losses(self) -> int:
        return sum(n for k, n in self.lost.items() if k.endswith("/envforge"))

    def merge(self, other: "Funnel") -> None:
        for name in ("candidates", "environment_built", "derived", "accepted", "skipped"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for mine, theirs in ((self.lost, other.lost), (self.reasons, other.reasons)):
            for key, n in theirs.items():
                mine[key] = mine.get(key, 0) + n

    def as_json(self) -> dict[str, Any]:
        return {
            "candidates": self.candidates,
            "environment_built": self.environment_built,
            "derived": self.derived,
            "accepted": self.accepted,
            "skipped": self.skipped,
            "envforge_losses": self.envforge_losses,
            "lost": dict(sorted(self.lost.items())),
            "reasons": dict(sorted(self.reasons.items(), key=lambda kv: -kv[1])),
        }


__all__ = ["Funnel", "Loss", "classify"]
