"""The service's settings: one typed object for Python, YAML-style env vars and the CLI.

Every field carries its help text and the environment variable that sets it, taken with its default
from the setting envforge.settings declares (and reads for `ServiceConfig.from_env()`), so
`envforge service serve` works with no configuration, and the production compose file sets them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

from envforge.errors import EnvforgeError
from envforge.settings import EnvSettings, SettingsError, read_env

_REPLICA = re.compile(r"^[a-z0-9]{1,16}$")


def _f(setting: str) -> Any:
    """A field with the default, variable and help of the setting `setting` (envforge.settings declares them)."""
    declared = EnvSettings.model_fields[setting]
    return field(
        default=declared.default, metadata={"env": str(declared.validation_alias), "help": declared.description or ""}
    )


@dataclass(frozen=True)
class TenantLimits:
    """What one tenant may use; defaults for new tenants, overridable per tenant from the CLI."""

    max_sessions: int = field(default=16, metadata={"help": "sessions open at once"})
    steps_per_minute: int = field(default=600, metadata={"help": "steps (and verifies) in any 60-second window"})
    sandbox_seconds_per_day: float = field(
        default=86400.0,
        metadata={"help": "sandbox wall time per UTC day, summed over the tenant's sessions (open time, not CPU time)"},
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"tenant limit {f.name} must be > 0, got {getattr(self, f.name)!r}")

    def as_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class ServiceConfig:
    """How the service runs: where it listens, how long idle sessions live, request caps, pool sizes."""

    host: str = _f("service_host")
    port: int = _f("service_port")
    idle_timeout_s: float = _f("service_idle_timeout_s")
    reap_interval_s: float = _f("service_reap_interval_s")
    max_request_bytes: int = _f("service_max_request_bytes")
    max_sessions_total: int = _f("service_max_sessions_total")
    pool_idle_per_image: int = _f("service_pool_idle_per_image")
    pool_max_starting: int = _f("service_pool_max_starting")
    record_every_sessions: int = _f("service_record_every_sessions")
    record_every_s: float = _f("service_record_every_s")
    mlflow: bool = _f("service_mlflow")
    tombstone_s: float = _f("service_tombstone_s")
    replica: str = _f("service_replica")
    lease_ttl_s: float = _f("service_lease_ttl_s")
    default_limits: TenantLimits = field(
        default_factory=TenantLimits, metadata={"help": "limits of tenants created without explicit ones"}
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "ServiceConfig":
        """The fields' variables (envforge.settings reads them) over the defaults."""
        try:
            env = read_env(environ)
        except SettingsError as exc:
            raise EnvforgeError(
                "service configuration: "
                + "; ".join(f"{var}={raw!r}: {expected} ({help})" for var, raw, expected, help in exc.problems)
            ) from None
        return cls(**{f.name: getattr(env, f"service_{f.name}") for f in fields(cls) if f.metadata.get("env")})

    def with_overrides(self, **changes: Any) -> "ServiceConfig":
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def __post_init__(self) -> None:
        for name in (
            "idle_timeout_s",
            "reap_interval_s",
            "max_request_bytes",
            "max_sessions_total",
            "pool_idle_per_image",
            "pool_max_starting",
            "record_every_sessions",
            "record_every_s",
            "lease_ttl_s",
        ):
            if getattr(self, name) <= 0:
                raise EnvforgeError(f"service configuration: {name} must be > 0, got {getattr(self, name)!r}")
        if self.replica and not _REPLICA.match(self.replica):
            raise EnvforgeError(
                f"service configuration: replica {self.replica!r} must be 1-16 of a-z and 0-9 (it prefixes session ids)"
            )
        if not 0 < self.port < 65536:
            raise EnvforgeError(f"service configuration: port {self.port} is not a TCP port")
