"""`envforge service ...`: run the environment service and manage its API keys.

A typer app of its own, added to the main CLI with one line, so it moves with the CLI package.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from envforge.config import Settings
from envforge.errors import EnvforgeError

service_app = typer.Typer(help="The environment service: envforge environments over HTTP for outside trainers.",
                          no_args_is_help=True)
keys_app = typer.Typer(help="API keys of the service's tenants (stored hashed).", no_args_is_help=True)
service_app.add_typer(keys_app, name="keys")

console = Console(stderr=True)
out = Console()
DataDir = typer.Option(None, "--data-dir", help="data directory (default: $ENVFORGE_DATA_DIR or ./.envforge)")


def _settings(data_dir: Optional[Path]) -> Settings:
    settings = Settings.from_env()
    return settings.with_data_dir(data_dir) if data_dir else settings


def _store(data_dir: Optional[Path]):
    from envforge.service.tenants import TenantStore, tenants_path

    return TenantStore(tenants_path(_settings(data_dir)))


def _fail(exc: Exception) -> None:
    console.print(f"[red]error:[/red] {exc}")
    raise typer.Exit(1)


@service_app.command("serve")
def serve(host: Optional[str] = typer.Option(None, help="listen address (default: $ENVFORGE_SERVICE_HOST or "
                                                         "127.0.0.1; put TLS in front, see docs/service.md)"),
          port: Optional[int] = typer.Option(None, help="port (default: $ENVFORGE_SERVICE_PORT or 8080)"),
          idle_timeout_s: Optional[float] = typer.Option(None, help="reap sessions idle this long"),
          data_dir: Optional[Path] = DataDir) -> None:
    """Serve the environment API (uvicorn) over the catalog's task sets, on the sandbox pool."""
    import uvicorn

    from envforge.deployment import Deployment, DeploymentError
    from envforge.service.app import create_app
    from envforge.service.config import ServiceConfig

    try:
        settings = Deployment.from_env().settings
        if data_dir:
            settings = settings.with_data_dir(data_dir)
        config = ServiceConfig.from_env().with_overrides(host=host, port=port, idle_timeout_s=idle_timeout_s)
    except (DeploymentError, EnvforgeError) as exc:
        _fail(exc)
    console.print(f"envforge service on http://{config.host}:{config.port} (data {settings.data_dir})")
    uvicorn.run(create_app(settings, config), host=config.host, port=config.port, log_level="warning",
                access_log=False, timeout_graceful_shutdown=30, ws_max_size=config.max_request_bytes)


@service_app.command("openapi")
def openapi(output: Optional[Path] = typer.Option(None, "-o", help="write here instead of stdout")) -> None:
    """Print the OpenAPI spec of the service (checked in as docs/service-openapi.json)."""
    from envforge.service.app import openapi_spec

    text = json.dumps(openapi_spec(), indent=2, sort_keys=True) + "\n"
    if output:
        output.write_text(text)
    else:
        sys.stdout.write(text)


@keys_app.command("create")
def keys_create(tenant: str = typer.Option(..., "--tenant", help="tenant name (created if new)"),
                task_set: List[str] = typer.Option([], "--task-set", help="task-set name or version the tenant may "
                                                                          "use (repeat; default for a new tenant: '*', "
                                                                          "all)"),
                max_sessions: Optional[int] = typer.Option(None, help="sessions open at once"),
                steps_per_minute: Optional[int] = typer.Option(None, help="steps and verifies per minute"),
                sandbox_seconds_per_day: Optional[float] = typer.Option(None, help="sandbox time per UTC day"),
                label: str = typer.Option("", help="a note stored with the key (who holds it)"),
                as_json: bool = typer.Option(False, "--json"), data_dir: Optional[Path] = DataDir) -> None:
    """Create an API key for a tenant (creating the tenant, or changing its scopes and limits when given).
    The key is printed once; only its hash is stored."""
    from dataclasses import replace

    from envforge.service.config import ServiceConfig

    store = _store(data_dir)
    try:
        existing = store.tenant(tenant)
        base = existing.limits if existing else ServiceConfig.from_env().default_limits
        changes = {k: v for k, v in {"max_sessions": max_sessions, "steps_per_minute": steps_per_minute,
                                      "sandbox_seconds_per_day": sandbox_seconds_per_day}.items() if v is not None}
        limits = replace(base, **changes) if changes or not existing else None
        t = store.upsert_tenant(tenant, task_set or None, limits)
        key, info = store.create_key(tenant, label)
    except (EnvforgeError, ValueError) as exc:
        _fail(exc)
    finally:
        store.close()
    if as_json:
        sys.stdout.write(json.dumps({"key": key, **info.as_json(), "task_sets": list(t.task_sets),
                                     "limits": t.limits.as_json()}) + "\n")
        return
    console.print(f"tenant {t.name}: task sets {', '.join(t.task_sets)}; limits {t.limits.as_json()}")
    console.print(f"key id {info.key_id} (shown once; store it now):")
    out.print(key)


@keys_app.command("list")
def keys_list(tenant: Optional[str] = typer.Option(None, "--tenant"), as_json: bool = typer.Option(False, "--json"),
              data_dir: Optional[Path] = DataDir) -> None:
    """Every key (id, tenant, label, created, revoked) and every tenant's scopes and limits; never the keys."""
    store = _store(data_dir)
    try:
        keys = [k.as_json() for k in store.keys(tenant)]
        tenants = [{"tenant": t.name, "task_sets": list(t.task_sets), "limits": t.limits.as_json()}
                   for t in store.tenants() if tenant is None or t.name == tenant]
    finally:
        store.close()
    if as_json:
        sys.stdout.write(json.dumps({"keys": keys, "tenants": tenants}) + "\n")
        return
    for t in tenants:
        out.print(f"tenant {t['tenant']}: task sets {', '.join(t['task_sets'])}; limits {t['limits']}")
    for k in keys:
        state = f"revoked {k['revoked_at']}" if k["revoked_at"] else "active"
        out.print(f"  {k['key_id']}  {k['tenant']:<20} {state:<30} created {k['created_at']}  {k['label']}")


@keys_app.command("revoke")
def keys_revoke(key_id: str = typer.Argument(..., help="the key id (or the whole key)"),
                data_dir: Optional[Path] = DataDir) -> None:
    """Revoke a key: the service refuses it (401) from the next request on."""
    store = _store(data_dir)
    try:
        done = store.revoke(key_id)
    finally:
        store.close()
    if not done:
        _fail(EnvforgeError(f"no active key {key_id!r}"))
    out.print(f"revoked {key_id}")
