"""The fleet's settings: one typed model for Python, YAML and environment variables.

Every field has its variable (`ENVFORGE_FLEET_<NAME>`, or `ENVFORGE_RAY_ADDRESS` for the
address) and its help text; envforge.settings declares the variables from these fields and reads
them for `FleetConfig.from_env()`; `FleetConfig.from_yaml()` reads a file with the same field names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envforge.sandbox.provider import SandboxProviderError

ADDRESS_ENV = "ENVFORGE_RAY_ADDRESS"
PREFIX = "ENVFORGE_FLEET_"


class FleetConfigError(SandboxProviderError):
    """The fleet cannot start as configured; the message names the setting (and node) to fix."""


class FleetConfig(BaseModel):
    """How envforge finds and uses its Ray cluster of sandbox nodes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ray_address: str = Field("", description=f"{ADDRESS_ENV}: the Ray head, `HOST:PORT` (GCS, usually 6379) for a "
                                              "driver on a cluster node or `ray://HOST:10001` for Ray Client; "
                                              "empty = `auto` (a cluster started on this machine)")
    namespace: str = Field("envforge", description="Ray namespace of the node agents; drivers that share it share "
                                                   "the agents and their warm pools")
    node_resource: str = Field("envforge_sandboxes", description="the Ray custom resource a sandbox node "
                                                                 "advertises; its amount is how many sandboxes "
                                                                 "the node may lease at once")
    max_idle_per_image: int = Field(4, ge=0, description="warm sandboxes a node keeps per image at most")
    max_idle_per_node: int = Field(16, ge=0, description="warm sandboxes a node keeps in all at most")
    idle_shrink_after_s: float = Field(30.0, gt=0, description="an image nobody has asked for this long loses its "
                                                               "warm sandboxes")
    lease_idle_timeout_s: float = Field(900.0, gt=0, description="a lease untouched this long is reclaimed by "
                                                                 "the node, even if its driver still beats")
    driver_timeout_s: float = Field(60.0, ge=15, description="a driver whose heartbeat (every 5 s while it holds "
                                                             "leases) a node has not heard this long has died: "
                                                             "its leases there are reclaimed")
    acquire_timeout_s: float = Field(900.0, gt=0, description="backpressure: how long an acquire waits for free "
                                                              "capacity before it fails as an infrastructure "
                                                              "fault")
    image_distribution: Literal["auto", "transfer", "build"] = Field(
        "auto", description="how a node gets an image it lacks: `transfer` (docker save/load through Ray's object "
                            "store), `build` (from the same recipe, content-hash tag), or `auto` (build task "
                            "layers, transfer base images: what bench/fleet.py measured to be faster)")
    discovery_interval_s: float = Field(2.0, gt=0, description="how often the dispatcher looks for nodes that "
                                                               "joined or left")
    min_engine_version: str = Field("20.10", description="the oldest Docker engine a node may run")
    connect_timeout_s: float = Field(10.0, gt=0, description="how long to wait for the Ray head to answer at start")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "FleetConfig":
        from envforge.settings import SettingsError, read_env, variables

        try:
            env = read_env(environ)
        except SettingsError as exc:
            raise FleetConfigError(f"fleet settings from environment:\n  {exc}") from None
        setting = variables()
        values: dict[str, Any] = {name: getattr(env, setting[ADDRESS_ENV if name == "ray_address"
                                                             else PREFIX + name.upper()])
                                  for name in cls.model_fields}
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
