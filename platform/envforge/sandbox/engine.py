"""Connecting to the Docker engine, with an actionable message when it is not there."""

from __future__ import annotations

import os
import socket

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


# Which process owns a container: orphans of dead owners are removed at start-up.
OWNER_LABEL = "envforge.owner"


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _owner_alive(owner: str) -> bool:
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True  # another machine's container: not ours to judge
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_orphans(client: docker.DockerClient) -> int:
    """Remove envforge containers whose owning process is gone.

    A killed dockerd leaves containers behind as 'Exited (137)', and a killed envforge
    process leaves running sandboxes nobody will release; both are found by label. Only
    containers that carry an owner label are candidates: image-build containers inherit the
    managed label from the base image but have no owner, and a live process's containers
    (running, created or exited) are its own business, whatever their state. Containers that
    vanish while we look (other processes churn them) are skipped.
    """
    removed = 0
    try:
        listed = client.containers.list(all=True, sparse=True, filters={"label": OWNER_LABEL})
    except DockerException:
        return 0
    for c in listed:
        owner = (c.attrs.get("Labels") or {}).get(OWNER_LABEL, "")
        if not owner or _owner_alive(owner):
            continue
        try:
            c.remove(force=True, v=True)
            removed += 1
        except DockerException:
            pass
    return removed
