"""What `envforge config show` and docs/configuration.md say about the settings: both are built from
envforge.settings, so the reference cannot drift from what is read (tests/test_settings.py holds
the committed doc equal to `configuration_markdown()`)."""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any, Mapping

from pydantic import SecretStr

from envforge.settings import (
    DEPLOY_VARIABLES,
    GROUPS,
    NOT_SETTINGS,
    EnvSettings,
    default_text,
    group_of,
    is_secret,
    origins,
    read_env,
)

MASK = "********"


def type_text(annotation: Any) -> str:
    """A field's type in a reader's words: `int`, `path`, `secret`, `resolve | refuse`..."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return " | ".join(type_text(a) for a in args)
    if typing.get_origin(annotation) is typing.Literal:
        return " | ".join(str(a) for a in typing.get_args(annotation))
    if annotation is SecretStr:
        return "secret"
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return "path"
    return getattr(annotation, "__name__", str(annotation))


def effective(environ: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Every setting with its variable, effective value (secrets masked; an unset one shows its default)
    and where the value came from, in docs order."""
    from envforge.config import Settings

    env = read_env(environ)
    came_from = origins(environ)
    settings = Settings.from_env(environ)  # the paths resolved, the MLflow store derived from the data dir
    derived = {
        "data_dir": settings.data_dir,
        "sandboxes_dir": settings.sandboxes_dir,
        "task_sources_dir": settings.task_sources_dir,
        "mlflow_tracking_uri": settings.mlflow_tracking_uri,
    }
    rows = []
    for name, f in EnvSettings.model_fields.items():
        value = derived.get(name, getattr(env, name))
        if value is not None and is_secret(name):
            value = MASK
        elif value is None:
            default = default_text(name).replace("`", "")
            value = f"(unset: {default})" if default != "unset" else "(unset)"
        elif isinstance(value, Path):
            value = str(value)
        rows.append(
            {
                "setting": name,
                "variable": str(f.validation_alias),
                "group": group_of(name),
                "value": value,
                "origin": came_from[name],
            }
        )
    order = list(GROUPS)
    return sorted(rows, key=lambda r: order.index(r["group"]))


def _extra_doc(name: str) -> bool:
    """The default is words (`default_doc`), not a value."""
    extra = EnvSettings.model_fields[name].json_schema_extra
    return isinstance(extra, dict) and bool(extra.get("default_doc"))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def configuration_markdown() -> str:
    """docs/configuration.md: every setting by group, with its type, default and help."""
    out = [
        "# Configuration",
        "",
        "<!-- Generated from platform/envforge/settings.py by `envforge config docs -o docs/configuration.md`;",
        "     edit the settings there, not this file (tests/test_settings.py fails when they differ). -->",
        "",
        "Every environment variable envforge reads, declared once in `envforge.settings` (one",
        "pydantic-settings model, one reader: `read_env()`). A fresh checkout needs none of them;",
        "production sets the ones docs/deploy.md names. An empty value is the same as unset unless",
        "the text says otherwise. A value of the wrong type stops the command with an error naming",
        "the variable. `envforge config show` prints each setting's effective value (secrets masked)",
        "and whether it came from the environment or the default; `--json` for scripts.",
        "",
    ]
    by_group: dict[str, list[str]] = {g: [] for g in GROUPS}
    for name in EnvSettings.model_fields:
        by_group[group_of(name)].append(name)
    for group, names in by_group.items():
        if not names:
            continue
        out += [f"## {GROUPS[group]}", "", "| Variable | Type | Default | What it sets |", "|---|---|---|---|"]
        for name in names:
            f = EnvSettings.model_fields[name]
            default = default_text(name)
            shown = (
                "unset"
                if default == "unset"
                else "(empty)"
                if not default
                else default
                if _extra_doc(name)
                else f"`{default}`"
            )
            out.append(
                f"| `{f.validation_alias}` | {_cell(type_text(f.annotation))} | {_cell(shown)} | "
                f"{_cell(f.description or '')} |"
            )
        out.append("")
    out += [
        "## Not settings",
        "",
        "Names envforge sets for processes it starts, not read as configuration (so not above):",
        "",
        "| Name | What it is |",
        "|---|---|",
    ]
    out += [f"| `{k}` | {_cell(v)} |" for k, v in NOT_SETTINGS.items()]
    out += [
        "",
        "Variables of the deployment scripts and compose files, read by them, not by envforge:",
        "",
        "| Name | What it is |",
        "|---|---|",
    ]
    out += [f"| `{k}` | {_cell(v)} |" for k, v in DEPLOY_VARIABLES.items()]
    out += [
        "",
        "Also not read by envforge itself: the proxy variables (`HTTP_PROXY`, `HTTPS_PROXY`, `NO_PROXY`) "
        "it forwards into image builds, `OTEL_EXPORTER_OTLP_*` (read by the OpenTelemetry exporter) and "
        "`DAGSTER_HOME` (Dagster's).",
        "",
    ]
    return "\n".join(out)
