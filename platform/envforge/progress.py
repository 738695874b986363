"""Progress display for the CLI: one rich bar per pipeline stage."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from envforge.pipeline import Progress as ProgressFn


@contextmanager
def rich_progress(console: Console) -> Iterator[ProgressFn]:
    bars: dict[str, int] = {}
    with Progress(SpinnerColumn(), TextColumn("[bold]{task.fields[stage]:<8}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=False) as prog:

        def update(stage: str, detail: str, done: int, total: int) -> None:
            if stage not in bars:
                bars[stage] = prog.add_task(detail, total=total, stage=stage)
            prog.update(bars[stage], completed=done, total=total, description=detail)

        yield update
