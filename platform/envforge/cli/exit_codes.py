"""The exit codes of every `envforge` command, in one table, so that a script can tell what to do next:
look at a result (1), retry (2), or fix the command or its input (64), which no retry ever fixes.

| code | meaning |
|---|---|
| 0 | done (`verify`: resolved) |
| 1 | the work ran and the answer is no: not resolved, a check failed, a step failed for a reason that is neither the infrastructure nor the input |
| 2 | infrastructure fault (the Docker engine, a container, a service): retrying can succeed |
| 3 | `rollout`: more of the batch's groups were dropped than `--max-dropped-fraction` allows |
| 64 | usage or validation error: an unknown option, a bad value, a missing or invalid file, spec or setting (sysexits' EX_USAGE) |

Click's own usage errors (an unknown option, a value that does not convert, a missing argument) exit
2 by default, the code that means "infrastructure fault" here; `UsageExitGroup` gives them 64.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from typer._click.exceptions import UsageError  # typer 0.29 carries its own click: these, not `click`'s
from typer.core import TyperGroup

from envforge.errors import BatchRejectedError, InfraError, SpecError


class ExitCode(IntEnum):
    OK = 0
    NO = 1
    INFRA = 2
    TOO_MANY_DROPPED = 3
    USAGE = 64


# Errors that mean the input is wrong: invalid records and batches; ValueError, which envforge raises for a
# bad value wherever one is checked (configs' __post_init__, settings, deployment variables, unknown task
# sets, store URLs; pydantic's ValidationError is one too); a path given that is missing or of the wrong kind.
VALIDATION_ERRORS: tuple[type[BaseException], ...] = (
    SpecError,
    BatchRejectedError,
    ValueError,
    FileNotFoundError,
    IsADirectoryError,
    NotADirectoryError,
)


def for_exception(exc: BaseException) -> ExitCode:
    """The exit code of a command that stopped on `exc`."""
    if isinstance(exc, InfraError):
        return ExitCode.INFRA
    if isinstance(exc, VALIDATION_ERRORS):
        return ExitCode.USAGE
    return ExitCode.NO


class UsageExitGroup(TyperGroup):
    """The root command group: a usage error anywhere below it (its own options or any subcommand's)
    exits ExitCode.USAGE instead of click's 2."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except UsageError as exc:
            exc.exit_code = ExitCode.USAGE
            raise

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as exc:
            exc.exit_code = ExitCode.USAGE
            raise
