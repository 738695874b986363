"""Getting an image onto a node that lacks it, without a registry.

Two ways, both deterministic because tags are content hashes: *transfer* (`docker save` on a
node that has it, the bytes through Ray's object store, `docker load` on the one that does
not) and *build* (the same recipe: a task image's build context, made by the driver from the
task, built on the node on top of its parent). `bench/fleet.py` measures both for the bundled
images: building a task layer over a present base is far cheaper than shipping the whole
image (a save carries every layer, base included), and shipping the base is far cheaper than
a debootstrap, so `auto` builds task images and transfers everything else.
"""

from __future__ import annotations

import io
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import docker
from docker.errors import APIError, DockerException, ImageNotFound

from envforge.config import Settings
from envforge.errors import InfraError
from envforge.sandbox.images import build_from_context, write_task_context
from envforge.task import Task


@dataclass(frozen=True)
class ImageRecipe:
    """How to build `tag` on a node: the parent it is built on and the build context (a tar)."""

    tag: str
    parent: str
    context_tar: bytes

    @classmethod
    def for_task(cls, task: Task, tag: str, parent: str, settings: Settings | None = None) -> "ImageRecipe":
        with tempfile.TemporaryDirectory(prefix="envforge-ctx-") as tmp:
            write_task_context(task, parent, Path(tmp), settings)
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tf:
                tf.add(tmp, arcname=".")
        return cls(tag, parent, buf.getvalue())


def parent_of(client: docker.DockerClient, tag: str) -> str | None:
    """The first tagged ancestor of a local image (the base a task image was built FROM), if any."""
    try:
        history = client.api.history(tag)
    except (ImageNotFound, APIError):
        return None
    for layer in history[1:]:
        for t in layer.get("Tags") or []:
            if t != tag:
                return t
    return None


def export_image(client: docker.DockerClient, tag: str) -> bytes:
    """`docker save` of one image, as bytes (every layer: the receiver may lack all of them)."""
    try:
        return b"".join(client.images.get(tag).save(named=True))
    except ImageNotFound:
        raise InfraError("image_missing", f"image {tag} is not on this node") from None
    except (APIError, DockerException) as exc:
        raise InfraError("image_transfer_failed", f"docker save {tag}: {exc}") from None


def import_image(client: docker.DockerClient, data: bytes, tag: str) -> None:
    """`docker load` of `export_image`'s bytes; checks the expected tag arrived."""
    try:
        client.images.load(data)
        client.images.get(tag)
    except ImageNotFound:
        raise InfraError("image_transfer_failed", f"docker load did not produce {tag}") from None
    except (APIError, DockerException) as exc:
        raise InfraError("image_transfer_failed", f"docker load {tag}: {exc}") from None


def build_image(client: docker.DockerClient, recipe: ImageRecipe) -> None:
    """Build `recipe.tag` from its context on this engine (its parent must be here already)."""
    with tempfile.TemporaryDirectory(prefix="envforge-build-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(recipe.context_tar)) as tf:
            tf.extractall(tmp, filter="data")
        try:
            build_from_context(client, Path(tmp), recipe.tag, f"image {recipe.tag} (fleet build)")
        except Exception as exc:  # noqa: BLE001 - ImageBuildError or engine errors: either way a node fault
            raise InfraError("image_build_failed", str(exc)[:2000]) from None
