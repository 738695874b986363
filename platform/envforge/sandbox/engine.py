"""Connecting to the Docker engine, with an actionable message when it is not there."""

from __future__ import annotations

import docker
from docker.errors import DockerException

from envforge.config import Settings
from envforge.errors import InfraError

# Every object envforge creates carries this label, so orphans can be found and removed.
MANAGED_LABEL = "envforge.managed"

_HOW_TO_START = "start it with `platform/deploy/docker-engine.sh` (as root) or `make engine`"


def docker_client(settings: Settings | None = None, timeout_s: int = 120) -> docker.DockerClient:
    """A client for the configured engine; raises InfraError('engine_unavailable') if it does not answer."""
    host = settings.docker_host if settings else None
    try:
        client = docker.DockerClient(base_url=host, timeout=timeout_s) if host else docker.from_env(timeout=timeout_s)
        client.ping()
    except DockerException as exc:
        raise InfraError("engine_unavailable", f"no Docker engine answers ({exc}); {_HOW_TO_START}") from None
    return client
