"""What every source parser returns: the good tasks and the rejected records with reasons."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from envforge.errors import Problem
from envforge.task import Task

if TYPE_CHECKING:
    from envforge.sources.candidate import Candidate


@dataclass
class LoadResult:
    """Good tasks, rejects, and candidates: history-mined tasks whose tests are derived next."""

    tasks: list[Task] = field(default_factory=list)
    rejects: list[Problem] = field(default_factory=list)
    candidates: list["Candidate"] = field(default_factory=list)
    # what a source looked at and left out on purpose (a history source's docs-only commits), with why:
    # not rejects, since nothing is wrong with them, but what a dry run shows
    skipped: list[Problem] = field(default_factory=list)
    cursor: str | None = None  # where a history source stopped reading (its branch head): the next load starts there

    def extend(self, other: "LoadResult") -> None:
        self.tasks.extend(other.tasks)
        self.rejects.extend(other.rejects)
        self.candidates.extend(other.candidates)
        self.skipped.extend(other.skipped)

    @property
    def ok(self) -> bool:
        return not self.rejects

    def _first(self, task_id: str, origin: str, seen: dict[str, str], field: str) -> bool:
        if task_id in seen:
            self.rejects.append(
                Problem(origin, field, f"duplicate task id {task_id!r}, first defined in {seen[task_id]}")
            )
            return False
        seen[task_id] = origin
        return True

    def add_unique(self, task: Task, seen: dict[str, str], field: str = "id") -> None:
        """Keep the task unless its id was already loaded (then it is a reject naming the first)."""
        if self._first(task.id, task.origin, seen, field):
            self.tasks.append(task)

    def add_unique_candidate(self, candidate: "Candidate", seen: dict[str, str], field: str = "id") -> None:
        if self._first(candidate.id, candidate.origin, seen, field):
            self.candidates.append(candidate)
