"""`envforge fleet ...`: the sandbox fleet's commands (mounted by envforge.cli)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from envforge.config import Settings

fleet_app = typer.Typer(help="The sandbox fleet on Ray: nodes, and the local multi-node demo.", no_args_is_help=True)
console = Console(stderr=True)


@fleet_app.command("demo")
def demo(json_out: Optional[Path] = typer.Option(None, "--json", help="also write the summary here"),
         samples: int = typer.Option(4, help="samples per task in the rollout batch"),
         data_dir: Optional[Path] = typer.Option(None, help="data directory (default ENVFORGE_DATA_DIR)")) -> None:
    """A head and two worker nodes on this machine (each with its own dockerd), a rollout batch and a
    gate across them, one worker killed mid-batch: the batch completes, nothing lost or duplicated."""
    from envforge.fleet.demo import DemoOptions, run_fleet_demo

    settings = Settings.from_env().with_data_dir(data_dir) if data_dir else Settings.from_env()
    settings.ensure_dirs()
    summary = run_fleet_demo(settings, DemoOptions(samples=samples),
                             say=lambda m: console.print(m, markup=False, soft_wrap=True))
    table = Table(title="fleet demo")
    for col in ("what", "figure"):
        table.add_column(col)
    r, g = summary["rollout"], summary["gate"]
    table.add_row("cluster", f"head + 2 worker nodes, each with its own dockerd ({summary['cluster_start_s']} s)")
    table.add_row("rollout", f"{r['stored']}/{r['expected']} trajectories stored, {r['unique']} unique, "
                             f"{r['dropped_groups']} groups dropped, {r['infra_retries']} infra retries")
    table.add_row("node killed", f"node-b with {r['in_flight_on_killed_node']} sandbox(es) in use; lost: "
                                 f"{', '.join(r['nodes_lost'])}")
    table.add_row("placements", ", ".join(f"{k}: {v}" for k, v in r["placements"].items()))
    table.add_row("gate", f"{g['accepted']}/{g['tasks']} accepted; sandboxes on "
                          + ", ".join(f"{k}: {v}" for k, v in g["placements"].items()))
    table.add_row("result", "OK: batch complete, none lost or duplicated" if summary["ok"] else "FAILED")
    table.add_row("wall", f"{summary['wall_s']} s")
    Console().print(table)
    out = json_out or settings.data_dir / "fleet_demo.json"
    out.write_text(json.dumps(summary, indent=2) + "\n")
    if not summary["ok"]:
        raise typer.Exit(1)


@fleet_app.command("nodes")
def nodes(as_json: bool = typer.Option(False, "--json")) -> None:
    """The sandbox nodes of the cluster at ENVFORGE_RAY_ADDRESS: capacity, leases, warm sandboxes, engine."""
    from envforge.fleet.config import FleetConfig
    from envforge.fleet.dispatcher import FleetDispatcher

    dispatcher = FleetDispatcher(FleetConfig.from_env()).start(strict=False)
    rows = [n.info for n in dispatcher.alive_nodes()]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="sandbox nodes")
    for col in ("node", "engine", "DOCKER_HOST", "capacity", "leased", "warm", "images"):
        table.add_column(col)
    for i in rows:
        table.add_row(i["node"], i["engine_version"], i["docker_host"], str(i["capacity"]), str(i["leased"]),
                      str(sum(i["idle"].values())), str(len(i["images"])))
    Console().print(table)
