"""Environment images, layered base -> (optional env Dockerfile) -> task, content-hash tagged.

A tag is a hash of everything that goes into the image, so "is it built?" is a tag lookup
and a second build of an unchanged recipe or task is a cache hit that costs milliseconds.
No registry is ever used: the base rootfs comes from debootstrap and is imported locally.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import docker
import yaml
from docker.errors import APIError, BuildError, ImageNotFound

from envforge import safefs
from envforge.config import Settings
from envforge.errors import ImageBuildError
from envforge.hashing import digest_parts, tree_digest
from envforge.sandbox.engine import MANAGED_LABEL
from envforge.task import Task

BASE_REPO = "envforge/base"
ROOTFS_REPO = "envforge/base-rootfs"
TASK_REPO_PREFIX = "envforge/task-"
ENV_REPO_PREFIX = "envforge/env-"
TEMPLATE_DIR = "/opt/envforge/task/workspace"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class BaseRecipe:
    """The `sandboxes/base/recipe.yaml` contents, typed."""

    suite: str
    mirror: str
    variant: str
    packages: list[str]
    strip: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, recipe_dir: Path) -> "BaseRecipe":
        path = recipe_dir / "recipe.yaml"
        try:
            data = yaml.safe_load(path.read_text())
            return cls(**data)
        except (OSError, yaml.YAMLError, TypeError) as exc:
            raise ImageBuildError(f"{path}: cannot read the base image recipe: {exc}") from None


@dataclass(frozen=True)
class ImageBuild:
    """The outcome of making sure one image exists."""

    tag: str
    cache_hit: bool
    seconds: float
    task_id: str | None = None
    size_mb: float | None = None


def _ca_bundle() -> bytes:
    return HOST_CA_BUNDLE.read_bytes() if HOST_CA_BUNDLE.is_file() else b""


def base_recipe_digest(settings: Settings) -> str:
    return digest_parts(tree_digest(settings.sandboxes_dir / "base"), _ca_bundle())


def base_image_tag(settings: Settings) -> str:
    return f"{BASE_REPO}:{base_recipe_digest(settings)[:16]}"


def image_exists(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
        return True
    except ImageNotFound:
        return False


def image_digest(client: docker.DockerClient, tag: str) -> str | None:
    """The image's id (sha256 of its config): changes whenever the image is rebuilt differently. None if absent."""
    try:
        return client.images.get(tag).id
    except ImageNotFound:
        return None


def _size_mb(client: docker.DockerClient, tag: str) -> float:
    return round(client.images.get(tag).attrs.get("Size", 0) / 2**20, 1)


def _build(client: docker.DockerClient, context: Path, tag: str, labels: dict[str, str],
           buildargs: dict[str, str] | None, what: str, log: Log, dockerfile: str = "Dockerfile") -> None:
    """Run a classic docker build, streaming its log; failures name `what` and the failing step."""
    tail: list[str] = []
    try:
        for chunk in client.api.build(path=str(context), dockerfile=dockerfile, tag=tag, labels=labels,
                                      buildargs=buildargs or {}, rm=True, forcerm=True, decode=True, pull=False):
            if "stream" in chunk:
                line = chunk["stream"].rstrip()
                if line:
                    tail = (tail + [line])[-15:]
                    log(line)
            if "error" in chunk:
                raise ImageBuildError(f"{what}: build failed: {chunk['error'].strip()}\n" + "\n".join(tail))
    except (APIError, BuildError) as exc:
        raise ImageBuildError(f"{what}: build failed: {exc}\n" + "\n".join(tail)) from None


def _debootstrap_rootfs(recipe: BaseRecipe, target: Path, log: Log) -> None:
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("base image: debootstrap is not installed; run `apt-get install -y debootstrap` "
                              "(make setup does this)")
    cmd = ["debootstrap", f"--variant={recipe.variant}", f"--include={','.join(recipe.packages)}",
           recipe.suite, str(target), recipe.mirror]
    log("$ " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ImageBuildError(f"base image: debootstrap failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n"
                              f"{proc.stderr[-2000:]}")
    for rel in recipe.strip:
        p = target / rel
        if p.is_dir():
            for child in p.iterdir():
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()


def build_base_image(client: docker.DockerClient, settings: Settings, log: Log = _quiet) -> ImageBuild:
    """Make sure the base image for the current recipe exists; build it if not (~1-2 min)."""
    started = time.perf_counter()
    tag = base_image_tag(settings)
    if image_exists(client, tag):
        return ImageBuild(tag, True, time.perf_counter() - started, size_mb=_size_mb(client, tag))
    recipe_dir = settings.sandboxes_dir / "base"
    recipe = BaseRecipe.load(recipe_dir)
    digest = tag.split(":", 1)[1]
    rootfs_tag = f"{ROOTFS_REPO}:{digest}"
    settings.build_dir.mkdir(parents=True, exist_ok=True)
    labels = {MANAGED_LABEL: "1", "envforge.recipe-digest": digest}
    if not image_exists(client, rootfs_tag):
        with tempfile.TemporaryDirectory(dir=settings.build_dir, prefix="rootfs-") as tmp:
            root = Path(tmp) / "rootfs"
            _debootstrap_rootfs(recipe, root, log)
            tar_path = Path(tmp) / "rootfs.tar"
            subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(tar_path), "."], check=True)
            log(f"importing rootfs as {rootfs_tag}")
            repo, rtag = rootfs_tag.split(":")
            with open(tar_path, "rb") as fh:
                client.api.import_image_from_data(fh, repository=repo, tag=rtag,
                                                  changes=[f'LABEL {MANAGED_LABEL}="1"'])
            shutil.rmtree(root, ignore_errors=True)
    with tempfile.TemporaryDirectory(dir=settings.build_dir, prefix="base-") as tmp:
        ctx = Path(tmp)
        for f in ("Dockerfile", "gitconfig"):
            shutil.copy(recipe_dir / f, ctx / f)
        (ctx / "host-ca.crt").write_bytes(_ca_bundle())
        _build(client, ctx, tag, labels, {"ROOTFS": rootfs_tag}, "base image", log)
    return ImageBuild(tag, False, time.perf_counter() - started, size_mb=_size_mb(client, tag))


def _resolve_parent(client: docker.DockerClient, task: Task, base_tag: str, settings: Settings, log: Log) -> str:
    """The image the task layer builds FROM: the base, a named local image, or the task's env Dockerfile."""
    env = task.spec.environment
    if env.dockerfile:
        dockerfile = Path(task.base_dir) / env.dockerfile
        env_tag = f"{ENV_REPO_PREFIX}{task.id}:" + digest_parts(base_tag, tree_digest(dockerfile.parent))[:16]
        if not image_exists(client, env_tag):
            log(f"building env image {env_tag}")
            _build(client, dockerfile.parent, env_tag, {MANAGED_LABEL: "1", "envforge.task": task.id},
                   {"ENVFORGE_BASE": base_tag}, f"task {task.id}: environment.dockerfile {dockerfile}", log,
                   dockerfile=dockerfile.name)
        return env_tag
    if env.base == "base":
        return base_tag
    if not image_exists(client, env.base):
        raise ImageBuildError(f"task {task.id}: environment.image {env.base!r} is not a local image "
                              "(no registry is used; build or load it first)")
    return env.base


def task_image_tag(task: Task, parent_tag: str) -> str:
    env = task.spec.environment.model_dump(mode="json", exclude={"limits", "network"})
    digest = digest_parts(parent_tag, json.dumps(env, sort_keys=True), task.workspace_digest)
    return f"{TASK_REPO_PREFIX}{task.id}:{digest[:16]}"


def _task_dockerfile(parent: str, task: Task) -> str:
    lines = [
        f"FROM {parent}",
        "USER sandbox",
        f"COPY --chown=1000:1000 workspace/ {TEMPLATE_DIR}/",
        f"WORKDIR {TEMPLATE_DIR}",
    ]
    for cmd in task.spec.environment.setup:
        lines.append("RUN " + json.dumps(["/bin/bash", "-euo", "pipefail", "-c", cmd]))
    # The initial state is a commit, so the policy's changes are always `git diff` against it.
    lines.append('RUN git init -q . && git add -A && git commit -q --allow-empty -m "envforge: task initial state"')
    lines += [f'LABEL {MANAGED_LABEL}="1" envforge.task="{task.id}" envforge.workspace="{task.workspace_digest}"',
              "WORKDIR /workspace"]
    return "\n".join(lines) + "\n"


def _write_workspace(task: Task, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    src = task.workspace_path()
    if src is not None:
        try:  # checked at ingest; checked again here, since the folder may have changed since
            safefs.copy_tree(src, dest)
        except (safefs.UnsafePath, OSError) as exc:
            raise ImageBuildError(f"task {task.id}: environment.files: {exc}") from None
        return
    repo = task.spec.environment.repository
    if repo is not None:
        repo_path = Path(task.base_dir) / repo.path
        archive = subprocess.run(["git", "-C", str(repo_path), "archive", "--format=tar", repo.commit],
                                 capture_output=True)
        if archive.returncode != 0:
            raise ImageBuildError(f"task {task.id}: environment.repository: git archive {repo.commit} failed: "
                                  f"{archive.stderr.decode(errors='replace').strip()}")
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tf:
            tf.extractall(dest, filter="data")


def build_task_image(client: docker.DockerClient, task: Task, base_tag: str, settings: Settings,
                     log: Log = _quiet) -> ImageBuild:
    """Make sure the task's image exists: base (or env) + workspace files + setup + initial commit."""
    started = time.perf_counter()
    parent = _resolve_parent(client, task, base_tag, settings, log)
    tag = task_image_tag(task, parent)
    if image_exists(client, tag):
        return ImageBuild(tag, True, time.perf_counter() - started, task.id, _size_mb(client, tag))
    settings.build_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=settings.build_dir, prefix=f"task-{task.id}-") as tmp:
        write_task_context(task, parent, Path(tmp))
        build_from_context(client, Path(tmp), tag, f"task {task.id}", log)
    return ImageBuild(tag, False, time.perf_counter() - started, task.id, _size_mb(client, tag))


def write_task_context(task: Task, parent: str, dest: Path) -> None:
    """The build context of a task's image (its workspace and Dockerfile): what a fleet node that
    lacks the image builds from, with the same content-hash tag."""
    _write_workspace(task, dest / "workspace")
    (dest / "Dockerfile").write_text(_task_dockerfile(parent, task))


def build_from_context(client: docker.DockerClient, context: Path, tag: str, what: str, log: Log = _quiet) -> None:
    _build(client, context, tag, {}, None, what, log)
