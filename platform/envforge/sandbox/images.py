"""Environment images, layered base -> env -> task, content-hash tagged.

- base: debootstrap rootfs + `sandboxes/base/Dockerfile`;
- env (optional): the task's `environment.dockerfile` built on the base, then its packages
  (`python`, `apt`, `pip`) as an env layer shared by every task with the same recipe and
  manifests (`envforge.sandbox.envlayer`);
- task: the workspace, the project's editable install, setup commands, the initial commit.

A tag is a hash of everything that goes into the image, so "is it built?" is a tag lookup
and a second build of an unchanged recipe or task is a cache hit that costs milliseconds.
No registry is ever used: the base rootfs comes from debootstrap and is imported locally.
Images carry `envforge.image` (base/env/task), never the managed label: containers inherit
their image's labels, and a build's intermediate containers must not look like sandboxes.
"""

from __future__ import annotations

import io
import json
import re
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
from docker.errors import APIError, BuildError, DockerException, ImageNotFound

from envforge import gitstore, safefs
from envforge.config import Settings
from envforge.errors import ImageBuildError, InfraError
from envforge.hashing import digest_parts, tree_digest
from envforge.sandbox.envlayer import EnvBuild, build_env_image, env_recipe
from envforge.task import WORKSPACE, Task

BASE_REPO = "envforge/base"
ROOTFS_REPO = "envforge/base-rootfs"
TASK_REPO_PREFIX = "envforge/task-"
DOCKERFILE_REPO_PREFIX = "envforge/envfile-"
IMAGE_LABEL = "envforge.image"
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
    env: EnvBuild | None = None  # the env layer under a task image, when it has one


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


# A step killed from outside (SIGKILL/SIGTERM, another process removing the build container, the
# engine going away) says nothing about the recipe: such builds are retried, never stored as rejects.
_KILLED = re.compile(
    r"returned a non-zero code: (137|143)\b|no such container|is not running|"
    r"connection (reset|refused|aborted)|unexpected EOF|context canceled|"
    r"failed to create endpoint|could not find bridge|no such network|"
    r"cannot connect to the docker daemon",
    re.I,
)


def _short(text: str) -> str:
    """One build message without the step's whole script or terminal colours, at most 300 characters."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    text = re.sub(r"The command '.*' returned", "The step returned", text, flags=re.S)
    return text.strip()[:300]


def _build(
    client: docker.DockerClient,
    context: Path,
    tag: str,
    labels: dict[str, str],
    buildargs: dict[str, str] | None,
    what: str,
    log: Log,
    dockerfile: str = "Dockerfile",
    network_mode: str | None = None,
) -> None:
    """Run a classic docker build, streaming its log; failures name `what` and the failing step.

    ImageBuildError for a failing recipe; InfraError('image_build_killed') for a build killed
    from outside, which callers retry.
    """
    tail: list[str] = []

    def failed(message: str) -> Exception:
        if _KILLED.search(message):
            return InfraError(
                "image_build_killed", f"{what}: the build was interrupted ({_short(message)}); it is retried"
            )
        lines = [_short(line) for line in tail if not line.startswith(("Step ", " ---> ", "Removing intermediate"))]
        return ImageBuildError(f"{what}: build failed: {_short(message)}\n" + "\n".join(lines[-12:]))

    try:
        for chunk in client.api.build(
            path=str(context),
            dockerfile=dockerfile,
            tag=tag,
            labels=labels,
            buildargs=buildargs or {},
            rm=True,
            forcerm=True,
            decode=True,
            pull=False,
            network_mode=network_mode,
        ):
            if "stream" in chunk:
                line = chunk["stream"].rstrip()
                if line:
                    tail = (tail + [line])[-40:]
                    log(line)
            if "error" in chunk:
                raise failed(chunk["error"])
    except (APIError, BuildError) as exc:
        raise failed(str(exc)) from None
    except (DockerException, OSError) as exc:
        raise InfraError(
            "image_build_killed", f"{what}: lost the engine during the build ({exc}); it is retried"
        ) from None


def _debootstrap_rootfs(recipe: BaseRecipe, target: Path, log: Log) -> None:
    if shutil.which("debootstrap") is None:
        raise ImageBuildError(
            "base image: debootstrap is not installed; run `apt-get install -y debootstrap` (make setup does this)"
        )
    cmd = [
        "debootstrap",
        f"--variant={recipe.variant}",
        f"--include={','.join(recipe.packages)}",
        recipe.suite,
        str(target),
        recipe.mirror,
    ]
    log("$ " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ImageBuildError(
            f"base image: debootstrap failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
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
    labels = {IMAGE_LABEL: "base", "envforge.recipe-digest": digest}
    if not image_exists(client, rootfs_tag):
        with tempfile.TemporaryDirectory(dir=settings.build_dir, prefix="rootfs-") as tmp:
            root = Path(tmp) / "rootfs"
            _debootstrap_rootfs(recipe, root, log)
            tar_path = Path(tmp) / "rootfs.tar"
            subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(tar_path), "."], check=True)
            log(f"importing rootfs as {rootfs_tag}")
            repo, rtag = rootfs_tag.split(":")
            with open(tar_path, "rb") as fh:
                client.api.import_image_from_data(
                    fh, repository=repo, tag=rtag, changes=[f'LABEL {IMAGE_LABEL}="rootfs"']
                )
            shutil.rmtree(root, ignore_errors=True)
    with tempfile.TemporaryDirectory(dir=settings.build_dir, prefix="base-") as tmp:
        ctx = Path(tmp)
        for f in ("Dockerfile", "gitconfig"):
            shutil.copy(recipe_dir / f, ctx / f)
        (ctx / "host-ca.crt").write_bytes(_ca_bundle())
        _build(client, ctx, tag, labels, {"ROOTFS": rootfs_tag}, "base image", log)
    return ImageBuild(tag, False, time.perf_counter() - started, size_mb=_size_mb(client, tag))


def _dockerfile_parent(client: docker.DockerClient, task: Task, base_tag: str, log: Log) -> str:
    """The image the env layer builds on: the base, a named local image, or the task's Dockerfile on the base."""
    env = task.spec.environment
    if env.dockerfile:
        dockerfile = Path(task.base_dir) / env.dockerfile
        if not dockerfile.is_file():
            raise ImageBuildError(f"task {task.id}: environment.dockerfile {dockerfile} does not exist")
        tag = f"{DOCKERFILE_REPO_PREFIX}{task.id}:" + digest_parts(base_tag, tree_digest(dockerfile.parent))[:16]
        if not image_exists(client, tag):
            log(f"building {tag} from {dockerfile}")
            _build(
                client,
                dockerfile.parent,
                tag,
                {IMAGE_LABEL: "env", "envforge.task": task.id},
                {"ENVFORGE_BASE": base_tag},
                f"task {task.id}: environment.dockerfile {dockerfile}",
                log,
                dockerfile=dockerfile.name,
            )
        return tag
    if env.base == "base":
        return base_tag
    if not image_exists(client, env.base):
        raise ImageBuildError(
            f"task {task.id}: environment.image {env.base!r} is not a local image "
            "(no registry is used; build or load it first)"
        )
    return env.base


# The git directory of a history task's repository, from the task's folder and its `environment.repository.path`:
# where a commit not yet in envforge's commit store is read from. The sources know how to materialize one
# (envforge.sources.gitrepo.repository_dir: bundles, patch series); the sandbox, below them, takes it from its caller.
RepositoryDir = Callable[[str, str], Path]


def _repository_dir(task: Task, settings: Settings, repository_dir: RepositoryDir | None) -> Path:
    repo = task.spec.environment.repository
    assert repo is not None
    if repository_dir is None:
        raise ImageBuildError(
            f"task {task.id}: environment.repository: commit {repo.commit} is not in envforge's "
            f"commit store ({gitstore.store_dir(settings.data_dir)}) and the caller gave no "
            f"`repository_dir` to read {repo.path!r} with"
        )
    try:
        return repository_dir(task.base_dir, repo.path)
    except ValueError as exc:
        raise ImageBuildError(f"task {task.id}: environment.repository: {exc}") from None


def workspace_file(
    task: Task, settings: Settings, rel: str, repository_dir: RepositoryDir | None = None
) -> bytes | None:
    """One file of the task's initial workspace (its repository commit, or its files folder), or None.
    `repository_dir`: where a commit not in the commit store is read from (see `RepositoryDir`)."""
    repo = task.spec.environment.repository
    if repo is not None:
        git_dir = gitstore.commit_dir(
            settings.data_dir, repo.commit, lambda: _repository_dir(task, settings, repository_dir)
        )
        proc = gitstore.git(git_dir, "show", f"{repo.commit}:{rel}")
        return proc.stdout if proc.returncode == 0 else None
    root = task.workspace_path()
    if root is None:
        return None
    path = (root / rel).resolve()
    return path.read_bytes() if path.is_relative_to(root.resolve()) and path.is_file() else None


def recorded_images(task: Task) -> dict:
    """The images a stored task records it was built on (`metadata.images`: base, env, env_freeze,
    env_plugins)."""
    images = task.spec.metadata.get("images")
    return images if isinstance(images, dict) else {}


def _refuse_other_layer(task: Task, layer: str, recorded: str, current: str, settings: Settings) -> None:
    raise ImageBuildError(
        f"task {task.id} was built on the {layer} image {recorded}, but would now be built on {current} "
        f"(base recipe: {settings.sandboxes_dir / 'base'}). A different {layer} changes what the task runs in: "
        f"use the recipe it was ingested with (ENVFORGE_SANDBOXES_DIR), re-ingest its source, or rebuild it on "
        f"the current one on purpose (--rebuild)"
    )


def _resolve_parent(
    client: docker.DockerClient,
    task: Task,
    base_tag: str,
    settings: Settings,
    log: Log,
    rebuild: bool = False,
    repository_dir: RepositoryDir | None = None,
) -> tuple[str, EnvBuild | None]:
    """The image the task layer builds FROM, and the env layer when the task has one."""
    recorded = recorded_images(task)
    if recorded.get("base") and recorded["base"] != base_tag and not rebuild:
        _refuse_other_layer(task, "base", recorded["base"], base_tag, settings)
    parent = _dockerfile_parent(client, task, base_tag, log)
    env = task.spec.environment
    if not env.needs_env_layer:
        return parent, None
    recipe = env_recipe(
        env_image_name(task),
        parent,
        env,
        lambda rel: workspace_file(task, settings, rel, repository_dir),
        recorded.get("env_freeze") or [],
        build_requirements(task),
        legacy=records_legacy_env(task),
    )
    if recorded.get("env") and recorded["env"] != recipe.tag and not rebuild:
        _refuse_other_layer(task, "env", recorded["env"], recipe.tag, settings)
    build = build_env_image(client, recipe, log)
    return build.tag, build


def build_requirements(task: Task) -> list[str]:
    """The build requirements among the task's pip lines (`metadata.environment.build_requires`,
    recorded by history sources for an editable install)."""
    about = task.spec.metadata.get("environment")
    build = about.get("build_requires") if isinstance(about, dict) else None
    return [b for b in build if isinstance(b, str)] if isinstance(build, list) else []


def records_legacy_env(task: Task) -> bool:
    """Whether the task records an env layer built before plugins were recorded (no `env_plugins`):
    it keeps that layer's recipe, so its recorded tag still matches."""
    recorded = recorded_images(task)
    return bool(recorded.get("env")) and "env_plugins" not in recorded


def env_image_name(task: Task) -> str:
    """The env image's repository name: the task's repository (project) name, else the task id."""
    return str(task.spec.metadata.get("repo") or task.id).split("/")[-1]


def task_image_tag(task: Task, parent_tag: str) -> str:
    env = task.spec.environment.model_dump(mode="json", exclude={"limits", "network"})
    digest = digest_parts(parent_tag, json.dumps(env, sort_keys=True), task.workspace_digest)
    return f"{TASK_REPO_PREFIX}{task.id}:{digest[:16]}"


# The project's own package, importable from the work tree: an editable install made against
# /workspace (where sandboxes mount the work tree), offline, with the build backend from the
# env layer. Files the build generates in the tree (a VCS version file, egg-info) join the
# task's initial state, so the work tree imports the same way in every sandbox.
_EDITABLE_INSTALL = r"""t=__TEMPLATE__
find /workspace -mindepth 1 -delete
cp -a "$t/." /workspace/
cd /workspace
export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PIP_NO_INPUT=1
if ! python3 -m pip install --no-deps --no-build-isolation --no-index -e . >/tmp/envforge-install.log 2>&1; then
  tail -n 25 /tmp/envforge-install.log
  echo "environment.install: the editable install of the repository failed (set environment.install: none,"        "or add the build backend to environment.pip)" >&2
  exit 1
fi
find . \( -name __pycache__ -o -name .git \) -prune -o \( -type f -o -type l \) -print | while IFS= read -r f; do
  if [ ! -e "$t/$f" ] && [ ! -L "$t/$f" ]; then mkdir -p "$t/$(dirname "$f")" && cp -a "$f" "$t/$f"; fi
done
chown -R 1000:1000 "$t"
cd / && find /workspace -mindepth 1 -delete
"""


def _task_dockerfile(parent: str, task: Task) -> str:
    env = task.spec.environment
    lines = [
        f"FROM {parent}",
        "USER sandbox",
        f"COPY --chown=1000:1000 workspace/ {TEMPLATE_DIR}/",
        f"WORKDIR {TEMPLATE_DIR}",
    ]
    if env.install == "editable":
        version = env.version or "0.0.0"
        script = (
            f"export SETUPTOOLS_SCM_PRETEND_VERSION={version} PDM_BUILD_SCM_VERSION={version}\n"
            + _EDITABLE_INSTALL.replace("__TEMPLATE__", TEMPLATE_DIR)
        )
        lines += ["USER root", "RUN " + json.dumps(["/bin/bash", "-euo", "pipefail", "-c", script]), "USER sandbox"]
    for cmd in env.setup:
        lines.append("RUN " + json.dumps(["/bin/bash", "-euo", "pipefail", "-c", cmd]))
    # The initial state is a commit, so the policy's changes are always `git diff` against it.
    lines.append('RUN git init -q . && git add -A && git commit -q --allow-empty -m "envforge: task initial state"')
    lines += [
        f'LABEL {IMAGE_LABEL}="task" envforge.task="{task.id}" envforge.workspace="{task.workspace_digest}"',
        f"WORKDIR {WORKSPACE}",
    ]
    return "\n".join(lines) + "\n"


def _write_workspace(task: Task, dest: Path, settings: Settings, repository_dir: RepositoryDir | None = None) -> None:
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
        git_dir = gitstore.commit_dir(
            settings.data_dir, repo.commit, lambda: _repository_dir(task, settings, repository_dir)
        )
        archive = gitstore.git(git_dir, "archive", "--format=tar", repo.commit)
        if archive.returncode != 0:
            raise ImageBuildError(
                f"task {task.id}: environment.repository: git archive {repo.commit} failed: "
                f"{archive.stderr.decode(errors='replace').strip()}"
            )
        if git_dir != gitstore.store_dir(settings.data_dir):  # first build from the source: keep the commit
            try:
                gitstore.keep_commit(settings.data_dir, git_dir, repo.commit)
            except ValueError:
                pass  # the build goes on from the source; only a later move of the source would notice
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tf:
            tf.extractall(dest, filter="data")


def build_task_image(
    client: docker.DockerClient,
    task: Task,
    base_tag: str,
    settings: Settings,
    log: Log = _quiet,
    rebuild: bool = False,
    repository_dir: RepositoryDir | None = None,
) -> ImageBuild:
    """Make sure the task's image exists: base (or env) + workspace files + setup + initial commit.

    A task that records the base and env images it was built on (history tasks do, at ingest) is
    refused with the reason when those would differ now, unless `rebuild` says to go ahead.
    A history task's commit is read from the commit store, else (and then kept there) from its
    repository, which `repository_dir` finds (see `RepositoryDir`).
    """
    started = time.perf_counter()
    parent, env = _resolve_parent(client, task, base_tag, settings, log, rebuild, repository_dir)
    tag = task_image_tag(task, parent)
    if image_exists(client, tag):
        return ImageBuild(tag, True, time.perf_counter() - started, task.id, _size_mb(client, tag), env)
    settings.build_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=settings.build_dir, prefix=f"task-{task.id}-") as tmp:
        write_task_context(task, parent, Path(tmp), settings, repository_dir)
        # The network is for setup commands only; the editable install is offline.
        build_from_context(
            client, Path(tmp), tag, f"task {task.id}", log, network_mode=None if task.spec.environment.setup else "none"
        )
    return ImageBuild(tag, False, time.perf_counter() - started, task.id, _size_mb(client, tag), env)


def write_task_context(
    task: Task, parent: str, dest: Path, settings: Settings | None = None, repository_dir: RepositoryDir | None = None
) -> None:
    """The build context of a task's image (its workspace and Dockerfile): what a fleet node that
    lacks the image builds from, with the same content-hash tag. `settings` say where envforge's
    object store of repository commits is (default: from the environment); `repository_dir` finds a
    history task's repository when that store lacks its commit (see `RepositoryDir`)."""
    _write_workspace(task, dest / "workspace", settings or Settings.from_env(), repository_dir)
    (dest / "Dockerfile").write_text(_task_dockerfile(parent, task))


def build_from_context(
    client: docker.DockerClient, context: Path, tag: str, what: str, log: Log = _quiet, network_mode: str | None = None
) -> None:
    _build(client, context, tag, {}, None, what, log, network_mode=network_mode)
