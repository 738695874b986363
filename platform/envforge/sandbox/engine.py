"""Connecting to the Docker engine, with an actionable message when it is not there."""

from __future__ import annotations

import os
import socket
import time
from contextlib import contextmanager
from typing import Iterator

import docker
import requests
import urllib3
from docker.errors import DockerException

from envforge.config import Settings
from envforge.errors import InfraError

_HOW_TO_START = "start it with `platform/deploy/docker-engine.sh` (as root) or `make engine`"
# What the docker SDK lets through when the engine is down, restarting or overloaded: its own
# errors, and those of the HTTP stack and the socket underneath (a dockerd restart surfaces as
# requests' ConnectionError, which is no DockerException).
ENGINE_ERRORS: tuple[type[BaseException], ...] = (
    DockerException,
    requests.exceptions.RequestException,
    urllib3.exceptions.HTTPError,
    OSError,
)


@contextmanager
def engine_call(cause: str = "engine_error") -> Iterator[None]:
    """Turn any engine or transport error raised inside into InfraError(cause)."""
    try:
        yield
    except InfraError:
        raise
    except ENGINE_ERRORS as exc:
        raise InfraError(cause, f"{type(exc).__name__}: {exc}"[:500]) from None


def engine_answers(client: docker.DockerClient) -> bool:
    try:
        return bool(client.ping())
    except ENGINE_ERRORS:
        return False


def wait_for_engine(client: docker.DockerClient, timeout_s: float = 120.0, first_delay_s: float = 0.25) -> float:
    """Block until the engine answers again (backing off up to 5 s between pings); returns the
    seconds waited. InfraError('engine_unavailable') if it does not within timeout_s."""
    started = time.monotonic()
    delay = first_delay_s
    while not engine_answers(client):
        waited = time.monotonic() - started
        if waited >= timeout_s:
            raise InfraError(
                "engine_unavailable", f"the Docker engine did not answer for {waited:.0f}s; {_HOW_TO_START}"
            )
        time.sleep(min(delay, max(0.0, timeout_s - waited)))
        delay = min(delay * 2, 5.0)
    return time.monotonic() - started


# Every object envforge creates carries this label, so orphans can be found and removed.
MANAGED_LABEL = "envforge.managed"


def docker_client(settings: Settings | None = None, timeout_s: int = 120) -> docker.DockerClient:
    """A client for the configured engine; raises InfraError('engine_unavailable') if it does not answer."""
    host = settings.docker_host if settings else None
    try:
        client = docker.DockerClient(base_url=host, timeout=timeout_s) if host else docker.from_env(timeout=timeout_s)
        client.ping()
    except ENGINE_ERRORS as exc:
        raise InfraError("engine_unavailable", f"no Docker engine answers ({exc}); {_HOW_TO_START}") from None
    return client


# Which process owns a container: orphans of dead owners are removed at start-up.
OWNER_LABEL = "envforge.owner"


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_alive(owner: str) -> bool:
    """Whether the process an `owner_id()` names still runs; another host's owner counts as alive
    (not ours to judge)."""
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
    except ENGINE_ERRORS:
        return 0
    for c in listed:
        owner = (c.attrs.get("Labels") or {}).get(OWNER_LABEL, "")
        if not owner or owner_alive(owner):
            continue
        try:
            c.remove(force=True, v=True)
            removed += 1
        except ENGINE_ERRORS:  # gone already (another process cleaned it), or the engine is busy
            pass
    return removed
