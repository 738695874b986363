"""Where a session's sandboxes come from, behind one small interface.

The service asks a backend for three things: the image of a task, an environment (the rollout
`RolloutEnv`, the same one `envforge rollout` uses) over a sandbox of that image, and its
statistics. `LocalPoolBackend` serves them from one Docker engine through the warm
`SandboxPool`; a fleet backend (Ray node agents) implements the same protocol later.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

import docker

from envforge.catalog import Catalog
from envforge.config import Settings
from envforge.rollout.env import RolloutEnv
from envforge.errors import ImageBuildError
from envforge.sandbox.container import run_blocking
from envforge.sandbox.pool import SandboxPool
from envforge.stages.configs import ImagesConfig
from envforge.stages.images import build_images
from envforge.task import Task
from envforge.verify.grader import Grader


class EnvBackend(Protocol):
    async def image_for(self, task: Task) -> str: ...

    def make_env(self, task: Task, image: str) -> RolloutEnv: ...

    def stats(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class LocalPoolBackend:
    """Sandboxes from the local (or DOCKER_HOST) engine via a warm pool; images from the catalog,
    built on first use by the images stage when the catalog has none for a task version (which
    records them)."""

    def __init__(self, settings: Settings, client: docker.DockerClient, idle_per_image: int = 8,
                 max_starting: int = 4):
        self.settings = settings
        self.client = client
        # Starting the pool removes containers whose owning process is dead: the sandboxes of a
        # service instance that was killed are cleaned up when the next one starts.
        self.pool = SandboxPool(client, max_idle_per_key=idle_per_image, max_starting=max_starting)
        self.grader = Grader(client, self.pool)
        self._images: dict[str, str] = {}
        self._build_lock = threading.Lock()

    def _image_blocking(self, task: Task) -> str:
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

    async def image_for(self, task: Task) -> str:
        return await run_blocking(self._image_blocking, task)

    def make_env(self, task: Task, image: str) -> RolloutEnv:
        return RolloutEnv(self.pool, self.grader, task, image)

    def stats(self) -> dict[str, Any]:
        return {"backend": "local-pool", "idle_sandboxes": self.pool.idle_count(), **self.pool.stats.as_dict()}

    def close(self) -> None:
        self.pool.close()
