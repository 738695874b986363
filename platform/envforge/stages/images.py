"""Images: the sandbox base image and one content-hash-tagged image per task, built once per run.

The stage returns an `ImageSet` (task version -> tag, tag -> image id); later stages of the same
run take it as an input instead of rebuilding or looking images up, and Dagster records it in the
`environment_images` materialization for the assets downstream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Mapping, Sequence

import docker

from envforge.catalog import Catalog
from envforge.config import Settings
from envforge.errors import Problem
from envforge.sandbox.engine import docker_client
from envforge.sandbox.images import ImageBuild, build_base_image, build_task_image
from envforge.sources.gitrepo import repository_dir
from envforge.stages.base import StageContext, StageResult, stage
from envforge.stages.configs import ImagesConfig
from envforge.task import Task


@dataclass(frozen=True)
class ImageSet:
    """The images one run built: what the stages after it run tasks in."""

    base: str
    tags: Mapping[str, str] = field(default_factory=dict)  # task content hash -> image tag
    digests: Mapping[str, str] = field(default_factory=dict)  # image tag -> image id (sha256:...)

    def items(self, tasks: Sequence[Task]) -> list[tuple[Task, str]]:
        """(task, image tag) for every task that has an image here, in the tasks' order."""
        return [(t, self.tags[t.content_hash]) for t in tasks if t.content_hash in self.tags]

    def missing(self, tasks: Sequence[Task]) -> list[Task]:
        return [t for t in tasks if t.content_hash not in self.tags]

    def merged(self, other: "ImageSet") -> "ImageSet":
        return ImageSet(other.base or self.base, {**self.tags, **other.tags}, {**self.digests, **other.digests})

    def to_json(self) -> dict[str, Any]:
        return {"base": self.base, "tags": dict(self.tags), "digests": dict(self.digests)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "ImageSet":
        return cls(doc["base"], dict(doc.get("tags") or {}), dict(doc.get("digests") or {}))


@dataclass
class ImagesResult(StageResult):
    base: ImageBuild
    builds: list[tuple[Task, ImageBuild]] = field(default_factory=list)
    failures: list[Problem] = field(default_factory=list)
    digests: dict[str, str] = field(default_factory=dict)

    @property
    def cache_hits(self) -> int:
        return sum(b.cache_hit for _, b in self.builds)

    @property
    def image_set(self) -> ImageSet:
        return ImageSet(self.base.tag, {t.content_hash: b.tag for t, b in self.builds}, dict(self.digests))

    def env_layers(self) -> dict[str, dict[str, Any]]:
        """Each env layer under this run's task images: built here or found, its build time, how many
        packages came from the pip cache, and how many tasks share it."""
        layers: dict[str, dict[str, Any]] = {}
        for _, b in self.builds:
            if b.env is None:
                continue
            layer = layers.setdefault(
                b.env.tag, {"built": False, "seconds": 0.0, "from_cache": 0, "downloaded": 0, "tasks": 0}
            )
            layer["tasks"] += 1
            if not b.env.cache_hit:
                layer.update(
                    built=True,
                    seconds=round(b.env.seconds, 2),
                    from_cache=b.env.from_cache,
                    downloaded=b.env.downloaded,
                )
        return layers

    def params(self) -> dict[str, Any]:
        return {"n_tasks": len(self.builds) + len(self.failures)}

    def metrics(self) -> dict[str, float]:
        built = [b for _, b in self.builds]
        layers = self.env_layers().values()
        return {
            "images_built": sum(not b.cache_hit for b in built),
            "images_cache_hits": self.cache_hits,
            "image_failures": len(self.failures),
            "base_build_s": self.base.seconds,
            "base_cache_hit": float(self.base.cache_hit),
            "task_build_s_total": sum(b.seconds for b in built),
            "env_layers": len(layers),
            "env_layers_built": sum(x["built"] for x in layers),
            "env_build_s_total": sum(x["seconds"] for x in layers),
        }

    def artifacts(self) -> dict[str, Any]:
        return {
            "images.json": {
                "base": self.base.tag,
                "images": {t.id: b.tag for t, b in self.builds},
                "digests": self.digests,
                "env_layers": self.env_layers(),
                "failures": [str(p) for p in self.failures],
            }
        }


def _digest(client: docker.DockerClient, tag: str) -> str:
    return client.images.get(tag).id


@stage("images")
def build_images(
    settings: Settings,
    config: ImagesConfig,
    tasks: Sequence[Task],
    context: StageContext = StageContext(),
    client: docker.DockerClient | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> ImagesResult:
    """Make sure the base image and every task's image exist; a failing task does not stop the rest.

    A task recorded as built on other base/env images is a failure with the reason unless
    `config.rebuild`. A build killed from outside is retried once, then an `infra:` failure.
    """
    from envforge.sources.derive import build_or_problem

    client = client or docker_client(settings)
    progress = context.progress
    total = len(tasks) + 1
    progress("images", "base image (first build takes 1-2 minutes)", 0, total)
    base = build_base_image(client, settings, log=log)
    result = ImagesResult(base=base, digests={base.tag: _digest(client, base.tag)})
    for i, task in enumerate(tasks, start=1):
        progress("images", task.id, i, total)
        build = build_or_problem(
            partial(
                build_task_image,
                client,
                task,
                base.tag,
                settings,
                log=log,
                rebuild=config.rebuild,
                repository_dir=repository_dir,
            ),
            task.origin,
        )
        if isinstance(build, Problem):
            result.failures.append(build)
            continue
        result.builds.append((task, build))
        result.digests[build.tag] = _digest(client, build.tag)
    progress("images", "done", total, total)
    if result.builds:
        Catalog(settings.catalog_path).record_images(result.builds)
    return result


def ensure_images(
    settings: Settings, tasks: Sequence[Task], images: ImageSet | None = None, context: StageContext = StageContext()
) -> ImageSet:
    """The run's ImageSet, completed for `tasks`: what it lacks (everything, when a command runs on its
    own without one) is built here, cache hits when the images exist."""
    images = images or ImageSet("")
    missing = images.missing(tasks)
    if missing:
        images = images.merged(build_images(settings, ImagesConfig(), missing, context=context).image_set)
    return images
