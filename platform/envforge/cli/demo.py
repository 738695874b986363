"""`envforge demo`: the whole asset graph on the bundled examples, in the Dagster instance `make ui` shows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import typer

from envforge.cli.common import DataDir, fail, settings_for
from envforge.errors import EnvforgeError


def demo(
    data_dir: Optional[Path] = DataDir,
    quick: bool = typer.Option(False, help="shortened stages (fewer gate runs, samples, training steps)"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="also write the summary as JSON here"),
) -> None:
    """Materialize the whole asset graph on the bundled examples (the main job end to end) in the Dagster
    instance `make ui` shows, and print what went through each stage and where to look."""
    from envforge.config import checkout_root

    root = checkout_root()
    if not (root / "assets" / "definitions.py").is_file():
        fail(
            EnvforgeError(
                f"the demo drives the Dagster code location in a checkout; {root} has no "
                "assets/definitions.py (run it from the envforge repository)"
            )
        )
    settings = settings_for(data_dir)
    env = {**os.environ, "ENVFORGE_DATA_DIR": str(settings.data_dir)}
    env.setdefault("DAGSTER_HOME", str(settings.data_dir / "dagster"))
    cmd = (
        [sys.executable, "-m", "assets.demo"]
        + (["--quick"] if quick else [])
        + (["--json", str(json_path.resolve())] if json_path else [])
    )
    raise typer.Exit(subprocess.run(cmd, cwd=root, env=env).returncode)
