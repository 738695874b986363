"""What every command group shares: the consoles, the data-dir option, settings, failing cleanly, and
turning a task-set reference a person typed into a version."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn, Optional

import typer
from rich.console import Console

from envforge.config import Settings
from envforge.errors import EnvforgeError, InfraError

console = Console(stderr=True)
out = Console()

# Exit codes: 0 done, 1 error or not resolved, 2 infrastructure fault, 3 a rollout batch dropped more of
# its groups than its config's max_dropped_fraction allows.
EXIT_TOO_MANY_DROPPED = 3

DataDir = typer.Option(None, "--data-dir", help="data directory (default: $ENVFORGE_DATA_DIR or ./.envforge)")


def settings_for(data_dir: Optional[Path]) -> Settings:
    settings = Settings.from_env()
    return settings.with_data_dir(data_dir) if data_dir else settings


def fail(exc: Exception) -> NoReturn:
    """Print the error and exit: 2 for an infrastructure fault (retry), 1 otherwise."""
    console.print(f"[red]error:[/red] {exc}")
    raise typer.Exit(2 if isinstance(exc, InfraError) else 1)


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
