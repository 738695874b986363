"""What every source parser returns: the good tasks and the rejected records with reasons."""

from __future__ import annotations

from dataclasses import dataclass, field

from envforge.errors import Problem
from envforge.task import Task


@dataclass
class LoadResult:
    tasks: list[Task] = field(default_factory=list)
    rejects: list[Problem] = field(default_factory=list)

    def extend(self, other: "LoadResult") -> None:
        self.tasks.extend(other.tasks)
        self.rejects.extend(other.rejects)

    @property
    def ok(self) -> bool:
        return not self.rejects
