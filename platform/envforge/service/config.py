"""The service's settings: one typed object for Python, YAML-style env vars and the CLI.

Every field carries its help text and the environment variable that sets it; envforge.settings
declares those variables from these fields and reads them for `ServiceConfig.from_env()`, with
the defaults here, so `envforge service serve` works with no configuration, and the production
compose file sets them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

from envforge.errors import EnvforgeError


def _f(default: Any, env: str, help: str) -> Any:
    return field(default=default, metadata={"env": env, "help": help})


@dataclass(frozen=True)
class TenantLimits:
    """What one tenant may use; defaults for new tenants, overridable per tenant from the CLI."""

    max_sessions: int = field(default=16, metadata={"help": "sessions open at once"})
    steps_per_minute: int = field(default=600, metadata={"help": "steps (and verifies) in any 60-second window"})
    sandbox_seconds_per_day: float = field(default=86400.0, metadata={
        "help": "sandbox wall time per UTC day, summed over the tenant's sessions (open time, not CPU time)"})

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"tenant limit {f.name} must be > 0, got {getattr(self, f.name)!r}")

    def as_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class ServiceConfig:
    """How the service runs: where it listens, how long idle sessions live, request caps, pool sizes."""

    host: str = _f("127.0.0.1", "ENVFORGE_SERVICE_HOST", "address to listen on (TLS is terminated in front)")
    port: int = _f(8080, "ENVFORGE_SERVICE_PORT", "port to listen on")
    idle_timeout_s: float = _f(600.0, "ENVFORGE_SERVICE_IDLE_TIMEOUT_S",
                               "a session with no request for this long is reaped: its sandbox reset and returned")
    reap_interval_s: float = _f(5.0, "ENVFORGE_SERVICE_REAP_INTERVAL_S", "how often idle sessions are looked for")
    max_request_bytes: int = _f(512 * 1024, "ENVFORGE_SERVICE_MAX_REQUEST_BYTES",
                                "largest request body accepted (413 above it); actions are capped at 256 KiB too")
    max_sessions_total: int = _f(256, "ENVFORGE_SERVICE_MAX_SESSIONS", "sessions open at once, all tenants together")
    pool_idle_per_image: int = _f(8, "ENVFORGE_SERVICE_POOL_IDLE", "warm sandboxes kept per task image")
    pool_max_starting: int = _f(4, "ENVFORGE_SERVICE_POOL_MAX_STARTING", "container starts in flight at once")
    record_every_sessions: int = _f(100, "ENVFORGE_SERVICE_RECORD_EVERY",
                                    "finished sessions per MLflow run (a batch); also flushed on a timer and at exit")
    record_every_s: float = _f(300.0, "ENVFORGE_SERVICE_RECORD_EVERY_S", "longest time a finished session waits "
                               "before its batch is written to the catalog and MLflow")
    mlflow: bool = _f(True, "ENVFORGE_SERVICE_MLFLOW", "log each batch of finished sessions as an MLflow run "
                      "(the catalog records every session either way)")
    tombstone_s: float = _f(3600.0, "ENVFORGE_SERVICE_TOMBSTONE_S",
                            "how long a reaped or lost session's id still answers 410 (then 404)")
    default_limits: TenantLimits = field(default_factory=TenantLimits, metadata={
        "help": "limits of tenants created without explicit ones"})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "ServiceConfig":
        """The fields' variables (envforge.settings reads them) over the defaults."""
        from envforge.settings import SettingsError, read_env

        try:
            env = read_env(environ)
        except SettingsError as exc:
            raise EnvforgeError("service configuration: " + "; ".join(f"{var}={raw!r}: {expected} ({help})"
                                                                      for var, raw, expected, help in exc.problems)
                                ) from None
        return cls(**{f.name: getattr(env, f"service_{f.name}") for f in fields(cls) if f.metadata.get("env")})

    def with_overrides(self, **changes: Any) -> "ServiceConfig":
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def __post_init__(self) -> None:
        for name in ("idle_timeout_s", "reap_interval_s", "max_request_bytes", "max_sessions_total",
                     "pool_idle_per_image", "pool_max_starting", "record_every_sessions", "record_every_s"):
            if getattr(self, name) <= 0:
                raise EnvforgeError(f"service configuration: {name} must be > 0, got {getattr(self, name)!r}")
        if not 0 < self.port < 65536:
            raise EnvforgeError(f"service configuration: port {self.port} is not a TCP port")
