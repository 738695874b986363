"""What every command group shares: the consoles, the data-dir option, settings, failing cleanly, and
turning a task-set reference a person typed into a version."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn, Optional

import typer
from rich.console import Console

from envforge.cli.exit_codes import ExitCode, for_exception
from envforge.config import Settings
from envforge.errors import EnvforgeError

console = Console(stderr=True)
out = Console()

EXIT_TOO_MANY_DROPPED = ExitCode.TOO_MANY_DROPPED  # the exit codes: cli/exit_codes.py

DataDir = typer.Option(None, "--data-dir", help="data directory (default: $ENVFORGE_DATA_DIR or ./.envforge)")


def settings_for(data_dir: Optional[Path]) -> Settings:
    settings = Settings.from_env()
    return settings.with_data_dir(data_dir) if data_dir else settings


def fail(exc: Exception) -> NoReturn:
    """Print the error and exit with its code (exit_codes.for_exception): 2 for an infrastructure fault
    (retry), 64 for a usage or validation error (fix the input), 1 otherwise."""
    console.print(f"[red]error:[/red] {exc}")
    raise typer.Exit(for_exception(exc))


def resolve_version(settings: Settings, ref: str) -> str:
    """The full task-set version for a unique prefix or 'latest' (Catalog.resolve_task_set), or exit."""
    from envforge.catalog import Catalog

    try:
        return Catalog(settings.catalog_path).resolve_task_set(ref)
    except EnvforgeError as exc:
        fail(exc)


def run_stage(stage: Any, *args: Any, progress: bool = True, **kwargs: Any) -> Any:
    """A stage's tracked form (an MLflow run) with rich progress bars, its sandboxes from the provider the
    environment chooses (`envforge.runtime`); library errors become a clean exit."""
    from envforge.progress import no_progress, rich_progress
    from envforge.runtime import sandbox_provider
    from envforge.stages.base import StageContext

    try:
        if not progress:
            return stage.tracked(
                *args, context=StageContext(progress=no_progress, sandboxes=sandbox_provider()), **kwargs
            )
        with rich_progress(console) as bars:
            return stage.tracked(*args, context=StageContext(progress=bars, sandboxes=sandbox_provider()), **kwargs)
    except (EnvforgeError, ValueError, OSError) as exc:
        fail(exc)
