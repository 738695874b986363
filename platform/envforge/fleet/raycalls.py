"""Ray on the driver: imported late (it is an optional extra), and what its exceptions say about a node.

Shared by the dispatcher (leases and placement) and the image distribution, which both call
node agents and must tell "that node is gone" from "that call failed there".
"""

from __future__ import annotations

from typing import Any

from envforge.fleet.config import FleetConfigError
from envforge.fleet.node import Fault


def ray_module() -> Any:
    """The `ray` module, or an error that says which extra installs it."""
    try:
        import ray
    except ImportError:
        raise FleetConfigError(
            "the sandbox fleet needs Ray: install envforge with the `fleet` extra (pip install -e '.[fleet]')"
        ) from None
    return ray


def unwrap(result: Any) -> Any:
    """A node agent's answer, with a `Fault` it sent back raised again as the exception it stands for."""
    if isinstance(result, Fault):
        raise result.rebuild()
    return result


def lost_errors() -> tuple[type[BaseException], ...]:
    """Ray's "that node or actor is gone" exceptions (looked up late: Ray is an optional extra)."""
    ray = ray_module()
    return (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError, ray.exceptions.NodeDiedError)


def node_gone(ray: Any, exc: BaseException) -> bool:
    """Whether an agent failed to answer because its node is gone (unreachable, or the actor never
    ran), as opposed to its constructor raising (no engine, an unsupported engine)."""
    if isinstance(exc, (ray.exceptions.ActorUnavailableError, ray.exceptions.TaskCancelledError)):
        return True
    return isinstance(exc, ray.exceptions.ActorDiedError) and "creation task" not in str(exc)


def root_message(exc: BaseException) -> str:
    """The innermost useful line of a Ray error (an actor's constructor failure arrives wrapped)."""
    text = str(exc)
    for marker in ("infrastructure fault", "FleetConfigError", "InfraError"):
        if marker in text:
            line = text[text.index(marker) :].splitlines()[0]
            return line.strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else type(exc).__name__
