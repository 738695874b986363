"""Images: the sandbox base image and one content-hash-tagged image per task, built once per run.

The stage returns an `ImageSet` (task version -> tag, tag -> image id); later stages of the same
run take it as an input instead of rebuilding or looking images up, and Dagster records it in the
`environment_images` materialization for the assets downstream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import docker

from envforge.catalog import Catalog
from envforge.config import Settings
from envforge.errors import ImageBuildError, Problem
from envforge.sandbox.engine import docker_client
from envforge.sandbox.images import ImageBuild, build_base_image, build_task_image
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

    def params(self) -> dict[str, Any]:
        return {"n_tasks": len(self.builds) + len(self.failures)}

    def metrics(self) -> dict[str, float]:
        built = [b for _, b in self.builds]
        return {"images_built": sum(not b.cache_hit for b in built), "images_cache_hits": self.cache_hits,
                "image_failures": len(self.failures), "base_build_s": self.base.seconds,
                "base_cache_hit": float(self.base.cache_hit), "task_build_s_total": sum(b.seconds for b in built)}

    def artifacts(self) -> dict[str, Any]:
        return {"images.json": {"base": self.base.tag, "images": {t.id: b.tag for t, b in self.builds},
                                "digests": self.digests, "failures": [str(p) for p in self.failures]}}


def _digest(client: docker.DockerClient, tag: str) -> str:
    return client.images.get(tag).id


@stage("images")
def build_images(settings: Settings, config: ImagesConfig, tasks: Sequence[Task],
                 context: StageContext = StageContext(), client: docker.DockerClient | None = None,
                 log: Callable[[str], None] = lambda _: None) -> ImagesResult:
    """Make sure the base image and every task's image exist; a failing task does not stop the rest."""
    client = client or docker_client(settings)
    progress = context.progress
    total = len(tasks) + 1
    progress("images", "base image (first build takes 1-2 minutes)", 0, total)
    base = build_base_image(client, settings, log=log)
    result = ImagesResult(base=base, digests={base.tag: _digest(client, base.tag)})
    for i, task in enumerate(tasks, start=1):
        progress("images", task.id, i, total)
        try:
            build = build_task_image(client, task, base.tag, settings, log=log)
        except ImageBuildError as exc:
            result.failures.append(Problem(task.origin, "environment", str(exc)))
            continue
        result.builds.append((task, build))
        result.digests[build.tag] = _digest(client, build.tag)
    progress("images", "done", total, total)
    if result.builds:
        Catalog(settings.catalog_path).record_images(result.builds)
    return result


def ensure_images(settings: Settings, tasks: Sequence[Task], images: ImageSet | None = None,
                  context: StageContext = StageContext()) -> ImageSet:
    """The run's ImageSet, completed for `tasks`: what it lacks (everything, when a command runs on its
    own without one) is built here, cache hits when the images exist."""
    images = images or ImageSet("")
    missing = images.missing(tasks)
    if missing:
        images = images.merged(build_images(settings, ImagesConfig(), missing, context=context).image_set)
    return images
