"""`envforge service ...`: run the environment service and manage its API keys."""

from __future__ import annotations

import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any, List, Optional

import typer

from envforge.cli.common import DataDir, console, fail, out, settings_for
from envforge.errors import EnvforgeError, InvalidValue
from envforge.service.config import ServiceConfig, TenantLimits

app = typer.Typer(
    help="The environment service: envforge environments over HTTP for outside trainers.", no_args_is_help=True
)
keys_app = typer.Typer(help="API keys of the service's tenants (stored hashed).", no_args_is_help=True)
app.add_typer(keys_app, name="keys")


def _store(data_dir: Optional[Path]):
    from envforge.service.tenants import TenantStore, tenants_path

    return TenantStore(tenants_path(settings_for(data_dir)))


def _override(config: type, name: str, default: str) -> Any:
    """An option that overrides one field of a service config; its help comes from the field."""
    f = next(f for f in fields(config) if f.name == name)
    return typer.Option(None, help=f"{f.metadata['help']} (default: {default})")


def _setting(name: str) -> Any:
    f = next(f for f in fields(ServiceConfig) if f.name == name)
    return _override(ServiceConfig, name, f"${f.metadata['env']} or {f.default}")


def _limit(name: str) -> Any:
    return _override(TenantLimits, name, "the tenant's current limit; for a new tenant the service's default")


@app.command("serve")
def serve(
    host: Optional[str] = _setting("host"),
    port: Optional[int] = _setting("port"),
    idle_timeout_s: Optional[float] = _setting("idle_timeout_s"),
    replicas: int = typer.Option(
        1,
        "--replicas",
        min=1,
        help="run this many service processes on loopback behind nginx on --host/--port, sessions routed "
        "to their replica by id, quotas shared (docs/service.md#several-replicas-behind-nginx)",
    ),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Serve the environment API (uvicorn) over the catalog's task sets, on the local sandbox pool (on the
    fleet when ENVFORGE_RAY_ADDRESS is set); every setting of the service's config from its environment
    variable (docs/service.md), these three also here."""
    import uvicorn

    from envforge.deployment import Deployment, DeploymentError
    from envforge.service.app import create_app

    try:
        settings = Deployment.from_env().settings
        if data_dir:
            settings = settings.with_data_dir(data_dir)
        config = ServiceConfig.from_env().with_overrides(host=host, port=port, idle_timeout_s=idle_timeout_s)
    except (DeploymentError, EnvforgeError) as exc:
        fail(exc)
    if replicas > 1:
        _serve_replicas(config, replicas, settings.data_dir, data_dir)
        return
    from envforge.observe.discovery import targets_dir
    from envforge.observe.http import free_port, registered_target

    port = config.port or free_port(config.host)
    console.print(f"envforge service on http://{config.host}:{port} (data {settings.data_dir})")
    with registered_target(
        "env_service", config.host, port, directory=targets_dir(settings.data_dir)
    ):  # /metrics, found by Prometheus' file_sd
        uvicorn.run(
            create_app(settings, config),
            host=config.host,
            port=port,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=30,
            ws_max_size=config.max_request_bytes,
        )


def _serve_replicas(config: ServiceConfig, count: int, data: Path, data_dir: Optional[Path]) -> None:
    """`serve --replicas N`: the replica set in the foreground until SIGTERM/Ctrl-C or nothing can serve."""
    import signal

    from envforge.service.replicas import ReplicaSet

    def stop(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    run_dir = data / "service" / "replicas"
    try:
        replica_set = ReplicaSet(config, count, run_dir, data_dir).start()
    except EnvforgeError as exc:
        fail(exc)
    console.print(f"envforge service: {count} replicas behind nginx on {replica_set.url} (run dir {run_dir})")
    for r in replica_set.describe()["replicas"]:
        console.print(f"  replica {r['name']} on {r['url']} (pid {r['pid']})")
    try:
        replica_set.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        replica_set.stop()


@app.command("openapi")
def openapi(output: Optional[Path] = typer.Option(None, "-o", help="write here instead of stdout")) -> None:
    """Print the OpenAPI spec of the service (checked in as docs/service-openapi.json)."""
    from envforge.service.app import openapi_spec

    text = json.dumps(openapi_spec(), indent=2, sort_keys=True) + "\n"
    if output:
        output.write_text(text)
    else:
        sys.stdout.write(text)


@keys_app.command("create")
def keys_create(
    tenant: str = typer.Option(..., "--tenant", help="tenant name (created if new)"),
    task_set: List[str] = typer.Option(
        [],
        "--task-set",
        help="task-set name or version the tenant may use (repeat; default for a new tenant: '*', all)",
    ),
    max_sessions: Optional[int] = _limit("max_sessions"),
    steps_per_minute: Optional[int] = _limit("steps_per_minute"),
    sandbox_seconds_per_day: Optional[float] = _limit("sandbox_seconds_per_day"),
    label: str = typer.Option("", help="a note stored with the key (who holds it)"),
    as_json: bool = typer.Option(False, "--json"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Create an API key for a tenant (creating the tenant, or changing its scopes and limits when given).
    The key is printed once; only its hash is stored."""
    from dataclasses import replace

    store = _store(data_dir)
    try:
        existing = store.tenant(tenant)
        base = existing.limits if existing else ServiceConfig.from_env().default_limits
        changes = {
            k: v
            for k, v in {
                "max_sessions": max_sessions,
                "steps_per_minute": steps_per_minute,
                "sandbox_seconds_per_day": sandbox_seconds_per_day,
            }.items()
            if v is not None
        }
        limits = replace(base, **changes) if changes or not existing else None
        t = store.upsert_tenant(tenant, task_set or None, limits)
        key, info = store.create_key(tenant, label)
    except (EnvforgeError, ValueError) as exc:
        fail(exc)
    finally:
        store.close()
    if as_json:
        sys.stdout.write(
            json.dumps({"key": key, **info.as_json(), "task_sets": list(t.task_sets), "limits": t.limits.as_json()})
            + "\n"
        )
        return
    console.print(f"tenant {t.name}: task sets {', '.join(t.task_sets)}; limits {t.limits.as_json()}")
    console.print(f"key id {info.key_id} (shown once; store it now):")
    out.print(key)


@keys_app.command("list")
def keys_list(
    tenant: Optional[str] = typer.Option(None, "--tenant"),
    as_json: bool = typer.Option(False, "--json"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Every key (id, tenant, label, created, revoked) and every tenant's scopes and limits; never the keys."""
    store = _store(data_dir)
    try:
        keys = [k.as_json() for k in store.keys(tenant)]
        tenants = [
            {"tenant": t.name, "task_sets": list(t.task_sets), "limits": t.limits.as_json()}
            for t in store.tenants()
            if tenant is None or t.name == tenant
        ]
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
def keys_revoke(
    key_id: str = typer.Argument(..., help="the key id (or the whole key)"), data_dir: Optional[Path] = DataDir
) -> None:
    """Revoke a key: the service refuses it (401) from the next request on."""
    store = _store(data_dir)
    try:
        done = store.revoke(key_id)
    finally:
        store.close()
    if not done:
        fail(InvalidValue(f"no active key {key_id!r}"))
    out.print(f"revoked {key_id}")
