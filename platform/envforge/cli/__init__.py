"""The `envforge` command: one module per command group, each a thin layer over envforge.stages.

Commands that do work call a stage's tracked form, so each logs an MLflow run. Settings that a
stage's config holds become options through `options.config_options`; a task-set version a person
types becomes a version in one place (`common.resolve_version`).
"""

from __future__ import annotations

import typer

from envforge.cli import (
    catalog,
    config,
    dedup,
    demo,
    fleet,
    gate,
    images,
    ingest,
    observe,
    policy,
    report,
    rollout,
    service,
    sources,
    taskset,
    train,
)
from envforge.cli.exit_codes import UsageExitGroup

app = typer.Typer(
    help="Turn workflows into verifiable RL environments.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    cls=UsageExitGroup,  # usage errors exit 64, not click's 2 ("infrastructure fault" here): cli/exit_codes.py
)


@app.callback()
def _observability() -> None:
    """JSON log lines on stderr when ENVFORGE_LOG_FORMAT=json (docs/observability.md)."""
    from envforge.cli.common import fail
    from envforge.observe.logs import configure_logging_from_env

    try:
        configure_logging_from_env()
    except ValueError as exc:
        fail(exc)


app.command()(demo.demo)
app.command()(ingest.ingest)
app.command()(gate.verify)
app.command()(gate.validate)
app.command()(rollout.rollout)
app.command("rollout-export")(rollout.rollout_export)
app.command()(rollout.tiers)
app.command()(report.report)
app.command()(train.lineage)
app.command()(ingest.schema)
app.add_typer(images.app, name="images")
app.add_typer(catalog.app, name="catalog")
app.add_typer(dedup.app, name="dedup")
app.add_typer(taskset.app, name="taskset")
app.add_typer(policy.app, name="policy")
app.add_typer(train.app, name="train")
app.add_typer(sources.app, name="sources")
app.add_typer(service.app, name="service")
app.add_typer(fleet.app, name="fleet")
app.add_typer(observe.app, name="observe")
app.add_typer(config.app, name="config")

__all__ = ["app"]
