"""Builds the production images (platform/deploy/production) on this machine, where no registry is
reachable: the Dockerfile's BASE is Dockerfile.python-base on envforge's own debootstrapped rootfs,
pip installs from PyPI, and torch comes from the local CPU wheel when one is there (the default
torch on PyPI brings CUDA, gigabytes this test never uses).

One build per content: the context is this checkout's files (tracked and untracked, not ignored:
what a `git clone` plus the working changes hold), and the image tags carry the digest of the part
that makes the images (IMAGE_INPUTS: the code, the recipes, the pins; not tests, docs or benches,
whose copies in the image nothing runs), so a second run reuses them; older images are removed.

Docker's classic builder does this (the engine's API; no buildx here), which reads no
Dockerfile.dockerignore: the curated context is what keeps .venv/ and data out.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import docker
from docker.errors import ImageNotFound

from envforge.config import Settings
from envforge.hashing import digest_parts
from envforge.sandbox.images import ROOTFS_REPO, _ca_bundle, build_base_image
from tests.conftest import REPO

PROD = REPO / "platform" / "deploy" / "production"
TEST_REPO = "envforge-stack-test"
WHEELS = ".wheels"  # inside the context: pip's find-links for the build
IMAGE_INPUTS = ("platform/", "assets/", "clients/", "sandboxes/", "task_sources/", "tests/stack/", "workspace.yaml",
                "pyproject.toml", "constraints.txt", "constraints-gpu.txt")
# Compose reads these from the checkout (mounts, project files), never from the image.
NOT_INPUTS = tuple(f"platform/deploy/production/{name}" for name in (
    "docker-compose", "dagster.yaml", "workspace.yaml", "postgres-init.sql", "env.example"))


@dataclass(frozen=True)
class ProductionImages:
    envforge: str  # the Dockerfile with EXTRAS=fleet: code location, webserver, daemon, MLflow, service, Ray head
    fleet_node: str  # Dockerfile.fleet-node on it
    postgres: str  # tests/stack/postgres: Debian's PostgreSQL with the official image's start-up contract
    built: bool  # False when every image was already there
    seconds: float


def _build(client: docker.DockerClient, context: Path, dockerfile: str, tag: str, buildargs: dict[str, str]) -> None:
    tail: list[str] = []
    for chunk in client.api.build(path=str(context), dockerfile=dockerfile, tag=tag, buildargs=buildargs,
                                  rm=True, forcerm=True, decode=True, pull=False):
        if line := chunk.get("stream", "").rstrip():
            tail = (tail + [line])[-40:]
        if "error" in chunk:
            raise AssertionError(f"building {tag} from {dockerfile} failed: {chunk['error']}\n" + "\n".join(tail))


def _exists(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
        return True
    except ImageNotFound:
        return False


def _checkout_files() -> list[str]:
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=True).stdout
    return sorted({p for p in out.decode().split("\0") if p and (REPO / p).is_file()})


def _torch_wheel(dest: Path) -> None:
    """The constraints' torch, the way this machine's pip picks it (the local CPU wheel where pip's
    find-links has one)."""
    pin = next(line.strip() for line in (REPO / "constraints.txt").read_text().splitlines()
               if line.startswith("torch=="))
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", pin, "-d", str(dest)],
                   check=True, capture_output=True, timeout=900)


def build(client: docker.DockerClient) -> ProductionImages:
    started = time.perf_counter()
    settings = Settings.from_env()
    base = build_base_image(client, settings)  # the sandbox base; its rootfs is the Python base's start
    rootfs = f"{ROOTFS_REPO}:{base.tag.split(':', 1)[1]}"
    with tempfile.TemporaryDirectory(prefix="envforge-stack-") as tmp:
        ctx = Path(tmp) / "context"
        inputs = []
        for rel in _checkout_files():
            (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, ctx / rel)
            if rel.startswith(IMAGE_INPUTS) and not rel.startswith(NOT_INPUTS):
                inputs += [rel, (REPO / rel).read_bytes()]
        digest = digest_parts(*inputs, rootfs, _ca_bundle())[:16]
        tags = ProductionImages(f"{TEST_REPO}:envforge-{digest}", f"{TEST_REPO}:node-{digest}",
                                f"{TEST_REPO}:postgres-{digest}", built=True, seconds=0.0)
        if all(_exists(client, t) for t in (tags.envforge, tags.fleet_node, tags.postgres)):
            return ProductionImages(tags.envforge, tags.fleet_node, tags.postgres, False,
                                    time.perf_counter() - started)

        python_ctx = Path(tmp) / "python-base"
        python_ctx.mkdir()
        shutil.copy(PROD / "Dockerfile.python-base", python_ctx / "Dockerfile")
        (python_ctx / "ca.crt").write_bytes(_ca_bundle())
        python_base = f"{TEST_REPO}:python-{digest}"
        _build(client, python_ctx, "Dockerfile", python_base, {"ROOTFS": rootfs})

        _torch_wheel(ctx / WHEELS)
        _build(client, ctx, "platform/deploy/production/Dockerfile", tags.envforge,
               {"BASE": python_base, "EXTRAS": "fleet", "PIP_FIND_LINKS": f"/opt/envforge/{WHEELS}"})
        _build(client, ctx, "platform/deploy/production/Dockerfile.fleet-node", tags.fleet_node,
               {"BASE": tags.envforge})
        _build(client, REPO / "tests" / "stack" / "postgres", "Dockerfile", tags.postgres, {"BASE": python_base})

    for image in client.images.list(name=TEST_REPO):  # older contents' images
        for tag in image.tags:
            if tag.startswith(f"{TEST_REPO}:") and not tag.endswith(digest):  # never another repository's tag
                client.images.remove(tag)
    return ProductionImages(tags.envforge, tags.fleet_node, tags.postgres, True, time.perf_counter() - started)


if __name__ == "__main__":  # build (or find) them by hand: python -m tests.production_images
    print(build(docker.from_env()))
