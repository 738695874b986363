"""`envforge fleet demo | nodes`: the sandbox fleet on Ray (the `fleet` extra; docs/fleet.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from envforge.cli.common import DataDir, console, fail, out, settings_for
from envforge.errors import EnvforgeError

app = typer.Typer(help="The sandbox fleet on Ray: nodes, and the local multi-node demo.", no_args_is_help=True)


@app.command("demo")
def demo(
    json_out: Optional[Path] = typer.Option(None, "--json", help="also write the summary here"),
    samples: int = typer.Option(4, help="samples per task in the rollout batch"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """A head and two worker nodes on this machine (each with its own dockerd), a rollout batch and a
    gate across them, one worker killed mid-batch: the batch completes, nothing lost or duplicated."""
    from envforge.demos.fleet import DemoOptions, run_fleet_demo

    settings = settings_for(data_dir)
    settings.ensure_dirs()
    try:
        summary = run_fleet_demo(
            settings, DemoOptions(samples=samples), say=lambda m: console.print(m, markup=False, soft_wrap=True)
        )
    except EnvforgeError as exc:  # a setting to fix (named in the message), or an infrastructure fault
        fail(exc)
    table = Table(title="fleet demo")
    for col in ("what", "figure"):
        table.add_column(col)
    r, g = summary["rollout"], summary["gate"]
    table.add_row("cluster", f"head + 2 worker nodes, each with its own dockerd ({summary['cluster_start_s']} s)")
    table.add_row(
        "rollout",
        f"{r['stored']}/{r['expected']} trajectories stored, {r['unique']} unique, "
        f"{r['dropped_groups']} groups dropped, {r['infra_retries']} infra retries",
    )
    table.add_row(
        "node killed",
        f"node-b with {r['in_flight_on_killed_node']} sandbox(es) in use; lost: {', '.join(r['nodes_lost'])}",
    )
    table.add_row("placements", ", ".join(f"{k}: {v}" for k, v in r["placements"].items()))
    table.add_row(
        "gate",
        f"{g['accepted']}/{g['tasks']} accepted; sandboxes on "
        + ", ".join(f"{k}: {v}" for k, v in g["placements"].items()),
    )
    table.add_row("result", "OK: batch complete, none lost or duplicated" if summary["ok"] else "FAILED")
    table.add_row("wall", f"{summary['wall_s']} s")
    out.print(table)
    path = json_out or settings.data_dir / "fleet_demo.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    if not summary["ok"]:
        raise typer.Exit(1)


@app.command("nodes")
def nodes(as_json: bool = typer.Option(False, "--json")) -> None:
    """The sandbox nodes of the cluster at ENVFORGE_RAY_ADDRESS: capacity, leases, warm sandboxes, engine."""
    from envforge.fleet.config import FleetConfig
    from envforge.fleet.dispatcher import FleetDispatcher

    try:
        dispatcher = FleetDispatcher(FleetConfig.from_env()).start(strict=False)
    except EnvforgeError as exc:  # no address, nothing answering there, no Ray: the message names the setting
        fail(exc)
    rows = [n.info for n in dispatcher.alive_nodes()]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="sandbox nodes")
    for col in ("node", "engine", "DOCKER_HOST", "capacity", "leased", "warm", "images"):
        table.add_column(col)
    for i in rows:
        table.add_row(
            i["node"],
            i["engine_version"],
            i["docker_host"],
            str(i["capacity"]),
            str(i["leased"]),
            str(sum(i["idle"].values())),
            str(len(i["images"])),
        )
    out.print(table)
