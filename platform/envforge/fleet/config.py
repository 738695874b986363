"""The fleet's settings: one typed model for Python, YAML and environment variables.

Every field has its variable (`ENVFORGE_FLEET_<NAME>`, or `ENVFORGE_RAY_ADDRESS` for the
address); envforge.settings declares each variable with its default and help text, which the
fields take from there, and reads them for `FleetConfig.from_env()`; `FleetConfig.from_yaml()`
reads a file with the same field names. The ranges are checked here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envforge.sandbox.provider import SandboxProviderError
from envforge.settings import EnvSettings, SettingsError, read_env, variables

ADDRESS_ENV = "ENVFORGE_RAY_ADDRESS"
PREFIX = "ENVFORGE_FLEET_"


def _setting(name: str, *, help_prefix: str = "", **constraints: Any) -> Any:
    """A field whose default and help are those of the setting `name` (envforge.settings declares them)."""
    declared = EnvSettings.model_fields[name]
    return Field(declared.default, description=help_prefix + (declared.description or ""), **constraints)


class FleetConfigError(SandboxProviderError):
    """The fleet cannot start as configured; the message names the setting (and node) to fix."""


class FleetConfig(BaseModel):
    """How envforge finds and uses its Ray cluster of sandbox nodes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ray_address: str = _setting("ray_address", help_prefix=f"{ADDRESS_ENV}: ")
    namespace: str = _setting("fleet_namespace")
    node_resource: str = _setting("fleet_node_resource")
    max_idle_per_image: int = _setting("fleet_max_idle_per_image", ge=0)
    max_idle_per_node: int = _setting("fleet_max_idle_per_node", ge=0)
    idle_shrink_after_s: float = _setting("fleet_idle_shrink_after_s", gt=0)
    lease_idle_timeout_s: float = _setting("fleet_lease_idle_timeout_s", gt=0)
    driver_timeout_s: float = _setting("fleet_driver_timeout_s", ge=15)
    acquire_timeout_s: float = _setting("fleet_acquire_timeout_s", gt=0)
    image_distribution: Literal["auto", "transfer", "build"] = _setting("fleet_image_distribution")
    discovery_interval_s: float = _setting("fleet_discovery_interval_s", gt=0)
    min_engine_version: str = _setting("fleet_min_engine_version")
    connect_timeout_s: float = _setting("fleet_connect_timeout_s", gt=0)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "FleetConfig":
        try:
            env = read_env(environ)
        except SettingsError as exc:
            raise FleetConfigError(f"fleet settings from environment:\n  {exc}") from None
        setting = variables()
        values: dict[str, Any] = {
            name: getattr(env, setting[ADDRESS_ENV if name == "ray_address" else PREFIX + name.upper()])
            for name in cls.model_fields
        }
        values.update(overrides)
        return cls._validated(values, "environment")

    @classmethod
    def from_yaml(cls, path: str | Path) -> "FleetConfig":
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise FleetConfigError(f"{path}: cannot read the fleet config: {exc}") from None
        if not isinstance(data, dict):
            raise FleetConfigError(f"{path}: expected a mapping of fleet settings")
        return cls._validated(data, str(path))

    @classmethod
    def _validated(cls, values: dict[str, Any], where: str) -> "FleetConfig":
        try:
            return cls(**values)
        except ValidationError as exc:
            problems = []
            for err in exc.errors():
                name = str(err["loc"][0]) if err["loc"] else ""
                setting = ADDRESS_ENV if name == "ray_address" else PREFIX + name.upper()
                problems.append(f"{name} ({setting}): {err['msg']}")
            raise FleetConfigError(f"fleet settings from {where}:\n  " + "\n  ".join(problems)) from None
