"""Progress reporting: the one callback type every long stage takes, and its displays.

A stage calls `progress(stage, detail, done, total)` as work advances; the CLI draws rich bars
(`rich_progress`), Dagster assets write log lines, and Python callers pass nothing
(`no_progress`).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterator

if TYPE_CHECKING:
    from rich.console import Console

# (stage, detail, done, total): called as work advances, so callers can draw bars or log lines.
Progress = Callable[[str, str, int, int], None]


def no_progress(stage: str, detail: str, done: int, total: int) -> None:
    """The default callback: progress goes nowhere."""


@contextmanager
def rich_progress(console: "Console") -> Iterator[Progress]:
    """One rich bar per stage, for the CLI."""
    from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as Bars

    bars: dict[str, int] = {}
    with Bars(
        SpinnerColumn(),
        TextColumn("[bold]{task.fields[stage]:<8}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as prog:

        def update(stage: str, detail: str, done: int, total: int) -> None:
            if stage not in bars:
                bars[stage] = prog.add_task(detail, total=total, stage=stage)
            prog.update(bars[stage], completed=done, total=total, description=detail)

        yield update
