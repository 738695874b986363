"""`envforge config`: the settings envforge reads from the environment (docs/configuration.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from envforge.cli.common import fail, out

app = typer.Typer(
    help="The settings envforge reads from the environment: effective values and their reference.", no_args_is_help=True
)


@app.command("show")
def show(as_json: bool = typer.Option(False, "--json", help="one JSON object per setting, in a list")) -> None:
    """Every setting, its effective value (secrets masked) and where it came from (environment or default)."""
    from rich.markup import escape
    from rich.table import Table

    from envforge.settings import GROUPS, SettingsError
    from envforge.settings_docs import effective

    try:
        rows = effective()
    except SettingsError as exc:
        fail(exc)
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
        return
    table = Table("variable", "value", "from")
    group = None
    for r in rows:
        if r["group"] != group:
            group = r["group"]
            table.add_section()
            table.add_row(f"[bold]{GROUPS[group]}[/bold]", "", "")
        colour = "green" if r["origin"] != "default" else "dim"
        table.add_row(r["variable"], escape(str(r["value"])), f"[{colour}]{r['origin']}[/{colour}]")
    out.print(table)


@app.command("docs")
def docs(
    output: Optional[Path] = typer.Option(
        None, "-o", "--output", help="write here (docs/configuration.md) instead of stdout"
    ),
) -> None:
    """The configuration reference (docs/configuration.md), generated from the settings model."""
    from envforge.settings_docs import configuration_markdown

    text = configuration_markdown()
    if output is None:
        print(text, end="")
    else:
        output.write_text(text)
