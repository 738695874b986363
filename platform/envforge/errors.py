"""Exception types shared across stages.

Two families matter to callers: input problems (`SpecError` and friends) that name the
file, the field and the problem so a user can fix their record, and infrastructure faults
(`InfraError`) that a scheduler retries and never scores as a model failure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_RECORD = re.compile(r"^(?P<file>.+?):(?P<record>\d+|row \d+)$")


class EnvforgeError(Exception):
    """Base class for every error envforge raises on purpose."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one input record, precise enough to fix without guessing."""

    source: str  # file path (or path:line for line-oriented formats)
    field: str  # dotted field path inside the record, "" for the whole record
    reason: str

    def __str__(self) -> str:
        where = f"{self.source}: {self.field}" if self.field else self.source
        return f"{where}: {self.reason}"

    @property
    def file(self) -> str:
        m = _RECORD.match(self.source)
        return m.group("file") if m else self.source

    @property
    def record(self) -> str:
        """The line (JSONL) or row (CSV) inside the file; "" when the whole file is the record."""
        m = _RECORD.match(self.source)
        return m.group("record") if m else ""

    def as_json(self) -> dict[str, str]:
        return {"source": self.file, "record": self.record, "field": self.field, "reason": self.reason}


class SpecError(EnvforgeError):
    """A single input record is invalid; carries every problem found in it."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class BatchRejectedError(EnvforgeError):
    """A batch was refused as a whole; nothing was written. Lists every problem at once."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        lines = [f"batch rejected, nothing written ({len(problems)} problem(s)):"]
        lines += [f"  - {p}" for p in problems]
        super().__init__("\n".join(lines))


class InfraError(EnvforgeError):
    """The infrastructure failed (engine, container, agent, image), not the model.

    Callers retry these on a fresh sandbox; they must never become a reward of 0.
    """

    def __init__(self, cause: str, detail: str = ""):
        self.cause = cause
        self.detail = detail
        super().__init__(f"infrastructure fault ({cause}){': ' + detail if detail else ''}")


class PolicyOutcome(EnvforgeError):
    """What the policy did inside its sandbox makes an operation impossible (its workspace changes
    are too large to diff, its memory use OOM-killed the command the sandbox was running).

    Anything a policy can cause is a model outcome: scored as reward 0 with `reason`, never
    retried or dropped as an infrastructure fault (a deterministic policy would fail the same
    way on every retry, and its failures belong in the training data).
    """

    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}{': ' + detail if detail else ''}")


class ImageBuildError(EnvforgeError):
    """An environment image could not be built; the message names the task and the step."""


class InvalidValue(EnvforgeError, ValueError):
    """A value a person gave (a name, an id, an option) is not acceptable; the message says which and why.
    A ValueError too, so that the CLI exits with its usage code (cli/exit_codes.py)."""
