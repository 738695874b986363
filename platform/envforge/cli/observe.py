"""`envforge observe`: the Prometheus side of observability: a scrape config for a data dir, and
the processes registered in it (docs/observability.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from envforge.cli.common import DataDir, console

app = typer.Typer(
    help="Observability: Prometheus scrape config and the registered /metrics targets.", no_args_is_help=True
)


def _dir(data_dir: Optional[Path]) -> Path:
    from envforge.observe.discovery import targets_dir

    return targets_dir(data_dir.resolve() if data_dir else None)


@app.command("prometheus-config")
def prometheus_config(
    data_dir: Optional[Path] = DataDir,
    scrape_interval_s: float = typer.Option(5.0, help="scrape and rule evaluation interval"),
) -> None:
    """Print a Prometheus config (YAML) that discovers every envforge process of the data dir through
    file_sd and loads envforge's alert rules."""
    from envforge.config import checkout_root
    from envforge.observe.discovery import prometheus_config as config_for

    rules = checkout_root() / "platform" / "deploy" / "observability" / "envforge-alerts.yml"
    directory = _dir(data_dir)
    directory.mkdir(parents=True, exist_ok=True)  # so Prometheus can watch it from its start
    print(json.dumps(config_for(directory, rules, scrape_interval_s), indent=2))  # JSON is YAML


@app.command("targets")
def targets(data_dir: Optional[Path] = DataDir) -> None:
    """List the processes serving /metrics now (stale entries of dead processes are pruned first)."""
    from envforge.observe.discovery import prune

    directory = _dir(data_dir)
    if not directory.is_dir():
        console.print(f"no targets registered ({directory} does not exist)")
        return
    prune(directory)
    for path in sorted(directory.glob("envforge-*.json")):
        for group in json.loads(path.read_text()):
            labels = {k: v for k, v in group["labels"].items() if not k.startswith("__")}
            print(f"{', '.join(group['targets'])}  {labels}")
