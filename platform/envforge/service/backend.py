"""Where a session's sandboxes come from, behind one small interface.

The service asks a backend for three things: the image of a task, an environment (the rollout
`RolloutEnv`, the same one `envforge rollout` uses) over a sandbox of that image, and its
statistics. `LocalPoolBackend` serves them from one Docker engine through the warm
`SandboxPool`; `FleetBackend` from the sandbox fleet's nodes (Ray node agents, docs/fleet.md)
through a `FleetSandboxPool`. `backend_from_env` picks between them by the stages' rule: the
fleet when `ENVFORGE_RAY_ADDRESS` is set, else the local pool.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Protocol

import docker

from envforge.catalog import Catalog
from envforge.config import Settings
from envforge.rollout.env import RolloutEnv
from envforge.errors import ImageBuildError
from envforge.sandbox.container import SandboxOptions, run_blocking
from envforge.sandbox.pool import SandboxPool
from envforge.stages.configs import ImagesConfig
from envforge.stages.images import build_images
from envforge.task import Task
from envforge.verify.grader import Grader, options_for

if TYPE_CHECKING:
    from envforge.fleet.dispatcher import FleetDispatcher
    from envforge.service.config import ServiceConfig

# A session wants two sandboxes of its task's image: the episode's and, when it verifies, the grade's.
SANDBOXES_PER_SESSION = 2


class EnvBackend(Protocol):
    async def image_for(self, task: Task) -> str: ...

    def make_env(self, task: Task, image: str) -> RolloutEnv: ...

    def stats(self) -> dict[str, Any]: ...

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
        catalog = Catalog(self.settings.catalog_path)
        image = catalog.latest_images().get(task.content_hash)
        if image is None:
            with self._build_lock:
                built = build_images(self.settings, ImagesConfig(), [task], client=self.client)
            if built.failures:
                raise ImageBuildError(str(built.failures[0]))
            image = built.image_set.tags[task.content_hash]
        self._images[task.content_hash] = image
        return image


class LocalPoolBackend:
    """Sandboxes from the local (or DOCKER_HOST) engine via a warm pool."""

    def __init__(self, settings: Settings, client: docker.DockerClient, idle_per_image: int = 8,
                 max_starting: int = 4):
        self.images = TaskImages(settings, client)
        # Starting the pool removes containers whose owning process is dead: the sandboxes of a
        # service instance that was killed are cleaned up when the next one starts.
        self.pool = SandboxPool(client, max_idle_per_key=idle_per_image, max_starting=max_starting)
        self.grader = Grader(client, self.pool)

    async def image_for(self, task: Task) -> str:
        return await run_blocking(self.images.resolve, task)

    def make_env(self, task: Task, image: str) -> RolloutEnv:
        return RolloutEnv(self.pool, self.grader, task, image)

    def stats(self) -> dict[str, Any]:
        return {"backend": "local-pool", "idle_sandboxes": self.pool.idle_count(), **self.pool.stats.as_dict()}

    def close(self) -> None:
        self.pool.close()


class FleetBackend:
    """Sandboxes on the fleet's nodes. Images are built (or found in the catalog) on this process's
    engine, as the stages do; the first session of a task registers it with the fleet pool, so a
    node lacking the image builds it from its recipe (or receives it) and nodes pre-heat it."""

    def __init__(self, settings: Settings, client: docker.DockerClient, dispatcher: "FleetDispatcher"):
        from envforge.fleet.run import fleet_pool

        self.images = TaskImages(settings, client)
        self.dispatcher = dispatcher
        self.pool = fleet_pool(dispatcher, [], SANDBOXES_PER_SESSION, local_client=client)
        self.grader = Grader(None, self.pool)  # grading runs on the nodes: no local engine needed
        self._registered: dict[str, SandboxOptions] = {}  # image -> the options its sandboxes start with
        self._register_lock = threading.Lock()

    def _image_blocking(self, task: Task) -> str:
        image = self.images.resolve(task)
        with self._register_lock:
            if image not in self._registered:
                self.pool.register([(task, image)], SANDBOXES_PER_SESSION, local_client=self.images.client)
                self._registered[image] = options_for(task)
        return image

    async def image_for(self, task: Task) -> str:
        return await run_blocking(self._image_blocking, task)

    def make_env(self, task: Task, image: str) -> RolloutEnv:
        return RolloutEnv(self.pool, self.grader, task, image)

    def stats(self) -> dict[str, Any]:
        idle = self.pool.idle_count()  # re-reads every node's warm pool
        nodes = [{"name": n.name, "capacity": n.capacity, "in_use": n.leased, "idle": sum(n.idle.values()),
                  "images": len(n.images)} for n in self.dispatcher.alive_nodes()]
        return {"backend": "fleet", "ray_address": self.dispatcher.config.ray_address, "nodes": nodes,
                "in_use": sum(n["in_use"] for n in nodes), "idle_sandboxes": idle,
                "nodes_lost": list(self.dispatcher.stats.nodes_lost), **self.pool.stats.as_dict()}

    def close(self) -> None:
        # The dispatcher and node agents are shared (other drivers, the process's stages); what this
        # backend started is its demand: withdraw it so nodes let the service's warm sandboxes go.
        with self._register_lock:
            withdrawn = {image: (options, 0) for image, options in self._registered.items()}
        if withdrawn:
            self.dispatcher.announce(withdrawn)
        self.pool.close()


def backend_from_env(settings: Settings, config: "ServiceConfig") -> EnvBackend:
    """The fleet when `ENVFORGE_RAY_ADDRESS` is set (the rule of the rollout and gate stages), else
    the warm pool on the configured Docker engine. Blocking: joins the Ray cluster when configured."""
    from envforge.fleet.backend import dispatcher_from_env
    from envforge.sandbox.engine import docker_client

    dispatcher = dispatcher_from_env()  # first: a fleet that cannot be joined fails the start naming the setting
    client = docker_client(settings)
    if dispatcher is not None:
        return FleetBackend(settings, client, dispatcher)
    return LocalPoolBackend(settings, client, config.pool_idle_per_image, config.pool_max_starting)
