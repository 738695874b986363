"""Where a unit of work's sandboxes come from: one interface, chosen once per process.

Every stage that runs sandboxes (a rollout batch, a gate, a derivation, the service's sessions)
asks a `SandboxProvider` for a `PoolLease` told the work ahead (the (task, image) pairs and the
sandboxes each will acquire) and takes its sandboxes from the lease's pool, which has
`SandboxPool`'s face (acquire / release and their asyncio twins, `stats`, `client`,
`wait_for_engine`, `idle_count`). `LocalSandboxProvider` is a warm `SandboxPool` on this
process's engine, owned by the lease and closed with it; the fleet's provider (the fleet
package's `provider.py`) is a pool over the Ray cluster's nodes. The process picks one in
one place (`envforge.runtime.sandbox_provider`) and hands it down (`StageContext.sandboxes`,
a `sandboxes=` argument); code handed none runs on the local engine. So the domain layers
never learn that a fleet exists, and where sandboxes run is configuration, not code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Sequence

from envforge.errors import EnvforgeError

if TYPE_CHECKING:
    import docker

    from envforge.config import Settings
    from envforge.sandbox.container import SandboxOptions
    from envforge.sandbox.pool import PoolStats, SandboxPool
    from envforge.task import Task

Items = Sequence[tuple["Task", str]]  # the work ahead: each task with its image tag


class SandboxProviderError(EnvforgeError, ValueError):
    """The provider cannot serve as configured (a fleet address that cannot be joined): the
    deployment's error, never a verdict on the tasks; the message names the setting to fix."""


class Pool(Protocol):
    """The sandbox-pool interface the scheduler, the grader, the gate and derivation use."""

    @property
    def client(self) -> Any:
        """The engine the pool's sandboxes run on, or None when they run elsewhere (the fleet's nodes)."""

    @property
    def stats(self) -> "PoolStats": ...

    def acquire(self, image: str, options: "SandboxOptions | None" = None) -> Any: ...

    def release(self, sandbox: Any) -> None: ...

    async def aacquire(self, image: str, options: "SandboxOptions | None" = None) -> Any: ...

    async def arelease(self, sandbox: Any) -> None: ...

    def idle_count(self, image: str | None = None) -> int: ...

    def wait_for_engine(self, timeout_s: float = 120.0) -> float: ...

    def close(self) -> None: ...


class PoolLease(Protocol):
    """A pool for one unit of work. As a context manager it yields the pool and closes the lease on
    exit: an owned pool (the local one) is closed; a shared one (the fleet's) is left running."""

    @property
    def pool(self) -> Pool: ...

    @property
    def owned(self) -> bool:
        """Whether closing the lease closes the pool (a local one) or leaves it to others (the fleet's)."""

    def expect(self, items: Items, sandboxes_per_task: int) -> None:
        """More work ahead (a derivation's image once built, a service session's task): the fleet
        learns its recipes and demand; the local pool needs nothing."""

    def describe(self) -> dict[str, Any]:
        """Where the sandboxes run, for health pages (`backend`: `local-pool` or `fleet`, ...)."""

    def withdraw(self) -> None:
        """This work wants no more sandboxes: a shared pool's nodes may let its warm ones go (the
        service, when it stops). Nothing for an owned pool: closing it frees them."""

    def close(self) -> None: ...

    def __enter__(self) -> Pool: ...

    def __exit__(self, *exc: Any) -> None: ...


class SandboxProvider(Protocol):
    """Where a process's sandboxes come from (see the module docstring)."""

    @property
    def kind(self) -> str:
        """ "local" | "fleet"."""

    def start(self) -> "SandboxProvider":
        """Join what serves the sandboxes now, so a bad setting fails here (a no-op locally)."""

    def lease(
        self,
        items: Items,
        sandboxes_per_task: int,
        *,
        client: "docker.DockerClient | None" = None,
        settings: "Settings | None" = None,
        max_idle_per_key: int = 8,
        max_starting: int = 4,
    ) -> PoolLease:
        """A pool for the work `items`, each task acquiring up to `sandboxes_per_task` sandboxes.
        `client` is this process's engine (where images are built: the local pool's engine, the
        fleet's source of image parents); `settings` say where history tasks' commits are.
        `max_idle_per_key` and `max_starting` size a local pool; the fleet sizes its own."""


class LocalLease:
    """A warm `SandboxPool` on one engine, owned: closing the lease closes the pool."""

    owned = True

    def __init__(self, pool: "SandboxPool"):
        self.pool = pool

    def expect(self, items: Items, sandboxes_per_task: int) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"backend": "local-pool"}

    def withdraw(self) -> None:
        return None

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> "SandboxPool":
        return self.pool

    def __exit__(self, *exc: Any) -> None:
        self.close()


class LocalSandboxProvider:
    """Sandboxes on this process's engine (`DOCKER_HOST`), a warm pool per unit of work: the default."""

    kind = "local"

    def start(self) -> "LocalSandboxProvider":
        return self

    def lease(
        self,
        items: Items,
        sandboxes_per_task: int,
        *,
        client: "docker.DockerClient | None" = None,
        settings: "Settings | None" = None,
        max_idle_per_key: int = 8,
        max_starting: int = 4,
    ) -> LocalLease:
        from envforge.sandbox.pool import SandboxPool

        if client is None:
            raise ValueError("a local sandbox pool needs the engine it runs on (client)")
        return LocalLease(SandboxPool(client, max_idle_per_key=max_idle_per_key, max_starting=max_starting))


def or_local(provider: SandboxProvider | None) -> SandboxProvider:
    """The provider handed down, or the local engine's when none was (a plain Python call)."""
    return provider if provider is not None else LocalSandboxProvider()
