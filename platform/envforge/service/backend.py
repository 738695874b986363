"""Where a session's sandboxes come from, behind one small interface.

The service asks a backend for three things: the image of a task, an environment (the rollout
`RolloutEnv`, the same one `envforge rollout` uses) over a sandbox of that image, and its
statistics. `SandboxBackend` serves them from a pool leased, for the service's lifetime, from
the sandbox provider the process chose (`envforge.runtime.sandbox_provider`, as the CLI and the
Dagster assets choose theirs): a warm `SandboxPool` on one Docker engine, or the sandbox fleet's
nodes (Ray node agents, docs/fleet.md) when `ENVFORGE_RAY_ADDRESS` is set. `backend_from_env`
makes that choice.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Protocol

import docker

from envforge.catalog import Catalog
from envforge.config import Settings
from envforge.errors import ImageBuildError
from envforge.rollout.env import RolloutEnv
from envforge.sandbox.container import run_blocking
from envforge.sandbox.engine import remove_orphans
from envforge.sandbox.provider import SandboxProvider, or_local
from envforge.stages.configs import ImagesConfig
from envforge.stages.images import build_images
from envforge.task import Task
from envforge.verify.grader import Grader

if TYPE_CHECKING:
    from envforge.service.config import ServiceConfig

# A session wants two sandboxes of its task's image: the episode's and, when it verifies, the grade's.
SANDBOXES_PER_SESSION = 2


class EnvBackend(Protocol):
    async def image_for(self, task: Task) -> str: ...

    def make_env(self, task: Task, image: str) -> RolloutEnv: ...

    def stats(self) -> dict[str, Any]: ...

    def reap_orphans(self) -> int: ...

    def close(self) -> None: ...


class TaskImages:
    """A task version's image tag: the catalog's, else built on first use by the images stage on
    `client`'s engine (which records it in the catalog)."""

    def __init__(self, settings: Settings, client: docker.DockerClient):
        self.settings, self.client = settings, client
        self._images: dict[str, str] = {}
        self._build_lock = threading.Lock()

    def resolve(self, task: Task) -> str:
        if task.content_hash in self._images:
            return self._images[task.content_hash]
        # One lookup at a time: a burst of first sessions would otherwise open the catalog from many
        # threads at once, and DuckDB refuses their concurrent schema statements (write-write conflict).
        with self._build_lock:
            if task.content_hash in self._images:
                return self._images[task.content_hash]
            image = Catalog(self.settings.catalog_path).latest_images().get(task.content_hash)
            if image is None:
                built = build_images(self.settings, ImagesConfig(), [task], client=self.client)
                if built.failures:
                    raise ImageBuildError(str(built.failures[0]))
                image = built.image_set.tags[task.content_hash]
            self._images[task.content_hash] = image
        return image


class SandboxBackend:
    """Sessions' sandboxes from one pool leased from `provider` (none: a warm pool on `client`'s engine).

    Images are built (or found in the catalog) on this process's engine, as the stages do. The
    first session of a task tells the lease its image (`expect`): on the fleet a node lacking the
    image builds it from its recipe (or receives it) and nodes pre-heat it; locally nothing is needed."""

    def __init__(
        self,
        settings: Settings,
        client: docker.DockerClient,
        provider: SandboxProvider | None = None,
        idle_per_image: int = 8,
        max_starting: int = 4,
    ):
        self.images = TaskImages(settings, client)
        self.client = client
        # Starting a local pool removes containers whose owning process is dead: the sandboxes of a
        # service instance that was killed are cleaned up when the next one starts.
        self.lease = or_local(provider).lease(
            [],
            SANDBOXES_PER_SESSION,
            client=client,
            settings=settings,
            max_idle_per_key=idle_per_image,
            max_starting=max_starting,
        )
        self.pool = self.lease.pool
        self.grader = Grader(self.pool.client, self.pool)  # on the fleet grading runs on the nodes: no engine here
        self._expected: set[str] = set()  # images told to the lease
        self._expect_lock = threading.Lock()

    def _image_blocking(self, task: Task) -> str:
        image = self.images.resolve(task)
        with self._expect_lock:
            if image not in self._expected:
                self.lease.expect([(task, image)], SANDBOXES_PER_SESSION)
                self._expected.add(image)
        return image

    async def image_for(self, task: Task) -> str:
        return await run_blocking(self._image_blocking, task)

    def make_env(self, task: Task, image: str) -> RolloutEnv:
        return RolloutEnv(self.pool, self.grader, task, image)

    def stats(self) -> dict[str, Any]:
        idle = self.pool.idle_count()  # on the fleet, re-reads every node's warm pool first
        return {**self.lease.describe(), "idle_sandboxes": idle, **self.pool.stats.as_dict()}

    def reap_orphans(self) -> int:
        """Remove the sandboxes of dead processes on this process's engine (a killed replica's), as a
        pool does when it starts; a fleet node's own are its agent's business."""
        return remove_orphans(self.client)

    def close(self) -> None:
        # A shared pool (the fleet's dispatcher and node agents serve other drivers and the process's
        # stages) is left running; what this backend started is its demand: withdraw it so nodes let
        # the service's warm sandboxes go. A local pool is closed.
        self.lease.withdraw()
        self.lease.close()


def backend_from_env(settings: Settings, config: "ServiceConfig") -> EnvBackend:
    """Sessions on the provider the process's settings choose (`envforge.runtime.sandbox_provider`: the
    fleet when `ENVFORGE_RAY_ADDRESS` is set, else the warm pool on the configured Docker engine).
    Blocking: joins the Ray cluster when configured, before any engine is touched."""
    from envforge.runtime import sandbox_provider
    from envforge.sandbox.engine import docker_client

    provider = sandbox_provider().start()  # first: a fleet that cannot be joined fails the start naming the setting
    return SandboxBackend(
        settings, docker_client(settings), provider, config.pool_idle_per_image, config.pool_max_starting
    )
