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

    def add_unique(self, task: Task, seen: dict[str, str], field: str = "id") -> None:
        """Keep the task unless its id was already loaded (then it is a reject naming the first)."""
        if task.id in seen:
            self.rejects.append(Problem(task.origin, field, f"duplicate task id {task.id!r}, first defined in "
                                                            f"{seen[task.id]}"))
            return
        seen[task.id] = task.origin
        self.tasks.append(task)
