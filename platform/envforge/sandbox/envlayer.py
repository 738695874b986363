"""The env layer: one image per (repository, environment recipe, dependency manifests).

Layers, as the SWE-bench harness builds them: base -> env -> task. The env image holds what a
repository's tests need (Debian packages, pip requirements, a checked interpreter), so every
task of the repository whose manifests did not change shares it, and ten tasks of one
repository install their dependencies once. Its tag is a digest of the parent image, the
recipe and the content of every requirements file the recipe reads, so a changed manifest
gives a new env image and an unchanged one is a cache hit (a tag lookup).

It is built by running the install in a container and committing it (not `docker build`):
that is what lets a pip cache volume (`envforge-pip-cache`) be mounted, shared by every env
build on the engine. It holds a wheelhouse: pip builds or fetches every requirement's wheel into
it and installs from it, so a package is downloaded once per engine, not once per image. (pip's
own HTTP cache depends on the index's caching headers, which proxies and mirrors may drop: the
first measurement here found it empty.) The
network is used only here, at build time; sandboxes have none. The container carries an owner
label, so another envforge process's orphan cleanup leaves it alone while this one lives, and
a build killed from outside is an infrastructure fault (retried), not a bad environment.
`pip freeze` of what was installed is kept in the image's labels, for the task's metadata.

Two things make the env layer behave like the project's own CI, which installs into a fresh
virtualenv and builds the project in an isolated build environment:

- build requirements (`[build-system].requires`, `setup_requires`) are upgraded, after the rest,
  to the newest version in the wheelhouse that satisfies them (`pip wheel` put the newest
  satisfying one there, whatever the image had). An isolated build installs exactly that; a
  plain install keeps whatever satisfies the range, such as the base image's Debian setuptools,
  which may be too old for the project's metadata;
- the `pytest11` entry points of the distributions this layer installed (the declared
  requirements and what they pulled in; not the parent image's, not the project itself, which
  is installed per task from a work tree a policy edits) are recorded in the image's labels.
  CI's pytest autoloads them; envforge keeps autoload off and loads exactly these by module
  name (`-p`), so a plugin a policy installs or writes is never loaded.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Callable

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from requests.exceptions import ReadTimeout

from envforge.environment import WORKSPACE, PythonEnvironment, pip_file_reference
from envforge.errors import ImageBuildError, InfraError
from envforge.hashing import digest_parts
from envforge.sandbox.engine import OWNER_LABEL, owner_id

ENV_REPO_PREFIX = "envforge/env-"
ENV_DIR = "/opt/envforge/env"
PIP_CACHE_VOLUME = "envforge-pip-cache"
PIP_CACHE_DIR = "/var/cache/envforge-pip"
WHEELHOUSE_DIR = f"{PIP_CACHE_DIR}/wheelhouse"
FREEZE_LABEL = "envforge.env.freeze"
PLUGINS_LABEL = "envforge.env.plugins"
BUILD_TIMEOUT_S = 1800
BUILDER_VERSION = "env-layer-3"  # part of every env tag: a change to how env layers are built rebuilds them
# The builder of env layers recorded by tasks stored before build requirements were upgraded and
# plugins recorded: such a task keeps its recorded tag (and loads no plugins).
LEGACY_BUILDER_VERSION = "env-layer-2"
_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")
_MAX_MANIFEST_FILES = 64
_MAX_MANIFEST_BYTES = 1 << 20

Log = Callable[[str], None]
ReadFile = Callable[[str], "bytes | None"]
_BUILD_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


@dataclass(frozen=True)
class EnvRecipe:
    """Everything an env image is made of; its tag is the digest of all of it."""

    name: str
    parent: str
    python: str | None
    apt: tuple[str, ...]
    pip: tuple[str, ...]
    files: dict[str, bytes] = field(default_factory=dict)  # requirements files by path in the repository
    # Exact versions recorded when a task was first built (its `pip freeze`): a rebuild elsewhere
    # installs the same ones. Not part of the tag, which names the recipe.
    constraints: tuple[str, ...] = ()
    # Build requirements, upgraded after the rest to the newest version that satisfies them.
    build: tuple[str, ...] = ()
    legacy: bool = False  # built as before env-layer-3 (a stored task that records such a layer)

    @property
    def tag(self) -> str:
        files = [part for path in sorted(self.files) for part in (path, self.files[path])]
        builder = LEGACY_BUILDER_VERSION if self.legacy else BUILDER_VERSION
        build = [] if self.legacy else [json.dumps(list(self.build))]
        digest = digest_parts(
            builder,
            self.parent,
            self.python or "",
            json.dumps(list(self.apt)),
            json.dumps(list(self.pip)),
            *build,
            *files,
        )
        return f"{ENV_REPO_PREFIX}{self.name}:{digest[:16]}"

    def requirements_txt(self) -> str:
        """The pip lines, with requirements files read from `repo/` beside it in the build context."""
        out = []
        for line in self.pip:
            ref = pip_file_reference(line)
            out.append(f"{ref[0]} repo/{os.path.normpath(ref[1])}" if ref else line)
        return "".join(line + "\n" for line in out)


def _sanitized(text: str, path: str, read: ReadFile, files: dict[str, bytes], problems: list[str]) -> bytes:
    """A requirements file with only requirements and -r/-c lines (followed); the project's own
    `-e .` and index options are left out: the project is installed per task, the index is ours."""
    kept = []
    for raw in text.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        if not line:
            continue
        ref = pip_file_reference(line)
        if ref is not None:
            target = (PurePosixPath(path).parent / ref[1]).as_posix()
            _collect(target, read, files, problems)
            kept.append(f"{ref[0]} {PurePosixPath(ref[1]).as_posix()}")
        elif line.startswith(("-", ".", "/")):
            continue
        else:
            kept.append(line)
    return ("\n".join(kept) + "\n").encode()


def _collect(path: str, read: ReadFile, files: dict[str, bytes], problems: list[str]) -> None:
    norm = os.path.normpath(path)
    if norm.startswith("..") or norm.startswith("/"):
        problems.append(f"{path}: outside the repository")
        return
    if norm in files:
        return
    if len(files) >= _MAX_MANIFEST_FILES:
        problems.append(f"more than {_MAX_MANIFEST_FILES} requirements files")
        return
    data = read(norm)
    if data is None:
        problems.append(f"requirements file {norm} does not exist in the repository")
        return
    if len(data) > _MAX_MANIFEST_BYTES:
        problems.append(f"requirements file {norm} is larger than 1 MiB")
        return
    files[norm] = b""  # cycle guard while following nested -r lines
    files[norm] = _sanitized(data.decode("utf-8", errors="replace"), norm, read, files, problems)


def env_recipe(
    name: str,
    parent: str,
    env: PythonEnvironment,
    read: ReadFile,
    constraints: list[str] | None = None,
    build: list[str] | None = None,
    legacy: bool = False,
) -> EnvRecipe:
    """The recipe of a task's env layer; ImageBuildError when a requirements file it names is missing.

    `build`: the lines of `env.pip` that are build requirements (upgraded to the newest satisfying
    version); `legacy`: the recipe of a layer a task stored before env-layer-3 records."""
    files: dict[str, bytes] = {}
    problems: list[str] = []
    for line in env.pip:
        ref = pip_file_reference(line)
        if ref is not None:
            _collect(ref[1], read, files, problems)
    if problems:
        raise ImageBuildError(f"environment.pip: {'; '.join(problems)}")
    slug = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-._")[:60] or "env"
    kept_build = () if legacy else tuple(b for b in build or () if b in env.pip and pip_file_reference(b) is None)
    return EnvRecipe(
        slug, parent, env.python, tuple(env.apt), tuple(env.pip), files, tuple(constraints or ()), kept_build, legacy
    )


# Run with the parent's interpreter before anything is installed (argument: where to write the
# parent's distributions), then after (arguments: that file and where to write the plugins): the
# `pytest11` entry points of distributions that are new or of another version than the parent's.
_PLUGIN_SCRIPT = """import json, sys
from importlib import metadata
def dists():
    return {((d.metadata['Name'] or '').lower().replace('_', '-'), d.version): d for d in metadata.distributions()}
if len(sys.argv) == 2:
    json.dump(sorted(map(list, dists())), open(sys.argv[1], 'w'))
    sys.exit(0)
parent = {tuple(x) for x in json.load(open(sys.argv[1]))}
found = set()
for key, dist in dists().items():
    if key not in parent:
        found.update(ep.value.split(':')[0].strip() for ep in dist.entry_points if ep.group == 'pytest11')
open(sys.argv[2], 'w').write(''.join(m + '\\n' for m in sorted(found) if m))
"""


def _build_script(recipe: EnvRecipe) -> str:
    lines = [
        "set -euo pipefail",
        f"cd {ENV_DIR}",
        f"if [ -f {ENV_DIR}/.proxy ]; then set -a; . {ENV_DIR}/.proxy; set +a; rm -f {ENV_DIR}/.proxy; fi",
        f"export PIP_CACHE_DIR={PIP_CACHE_DIR} PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 "
        "PIP_ROOT_USER_ACTION=ignore PIP_NO_INPUT=1 PIP_PROGRESS_BAR=off DEBIAN_FRONTEND=noninteractive",
    ]
    if recipe.python:
        want = shlex.quote(recipe.python)
        lines.append(
            "python3 - " + want + " <<'EOF'\n"
            "import re, sys\n"
            "want = sys.argv[1]\n"
            "have = '%d.%d.%d' % sys.version_info[:3]\n"
            "if re.fullmatch(r'3\\.\\d+', want):\n"
            "    ok = have.rsplit('.', 1)[0] == want\n"
            "else:\n"
            "    from pip._vendor.packaging.specifiers import SpecifierSet\n"
            "    ok = SpecifierSet(want).contains(have, prereleases=True)\n"
            "if not ok:\n"
            "    sys.exit(f'environment.python: {want} is wanted, the image has Python {have} (the base offers '\n"
            "             f'one interpreter; for another, use environment.image or environment.dockerfile with one)')\n"
            "EOF"
        )
    if recipe.apt:
        pkgs = " ".join(shlex.quote(p) for p in recipe.apt)
        lines.append(
            f"apt-get update -q && apt-get install -y -q --no-install-recommends {pkgs} && rm -rf /var/lib/apt/lists/*"
        )
    if not recipe.legacy:
        lines.append(
            f"cat > {ENV_DIR}/plugins.py <<'EOF'\n{_PLUGIN_SCRIPT}EOF\n"
            f"python3 -I {ENV_DIR}/plugins.py {ENV_DIR}/parent-dists.json"
        )
    pin = " -c constraints.envforge.txt" if recipe.constraints else ""
    if recipe.pip:
        reqs = f"-r requirements.envforge.txt{pin}"
        # Wheels go to the engine's wheelhouse first (one writer at a time; a wheel already there is
        # not downloaded again, whatever caching headers the index or a proxy sends), then the
        # install reads only the wheelhouse. A requirement pip cannot turn into a wheel falls back to
        # a plain install from the index.
        lines.append(
            f"mkdir -p {WHEELHOUSE_DIR}\n"
            f"if flock {WHEELHOUSE_DIR}/.lock python3 -m pip wheel -w {WHEELHOUSE_DIR} {reqs} "
            f"&& python3 -m pip install --no-warn-script-location --no-index --find-links {WHEELHOUSE_DIR} {reqs}; then\n"
            "  :\n"
            "else\n"
            "  echo 'envforge: the wheelhouse install failed; installing from the index'\n"
            f"  python3 -m pip install --no-warn-script-location {reqs}\n"
            "fi"
        )
    if recipe.build:
        # As an isolated build would: the newest satisfying version (pip wheel above put it in the
        # wheelhouse even where the image already had an older one that satisfies the range).
        build = " ".join(shlex.quote(b) for b in recipe.build) + pin
        lines.append(
            f"python3 -m pip install --no-warn-script-location --upgrade --no-index --find-links {WHEELHOUSE_DIR} "
            f"{build} || python3 -m pip install --no-warn-script-location --upgrade {build}"
        )
    if not recipe.legacy:
        lines.append(f"python3 -I {ENV_DIR}/plugins.py {ENV_DIR}/parent-dists.json {ENV_DIR}/plugins.txt")
    lines.append(f"python3 -m pip freeze --all > {ENV_DIR}/freeze.txt")
    lines.append(f"chmod -R a+rX {ENV_DIR}")
    return "\n".join(lines) + "\n"


def _context_tar(recipe: EnvRecipe) -> bytes:
    proxies = "".join(f"{k}={shlex.quote(os.environ[k])}\n" for k in _PROXY_VARS if os.environ.get(k))
    members = {
        "build.sh": _build_script(recipe).encode(),
        "requirements.envforge.txt": recipe.requirements_txt().encode(),
        "constraints.envforge.txt": "".join(c + "\n" for c in recipe.constraints if "==" in c).encode(),
        **{f"repo/{path}": data for path, data in recipe.files.items()},
    }
    if proxies:
        members[".proxy"] = proxies.encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in sorted(members):
            info = tarfile.TarInfo(f"env/{name}")
            info.size, info.mode, info.mtime = len(members[name]), 0o644, 0
            tar.addfile(info, io.BytesIO(members[name]))
    return buf.getvalue()


@dataclass(frozen=True)
class EnvBuild:
    """One env layer: built or found, with what pip installed and how much came from its cache."""

    tag: str
    cache_hit: bool
    seconds: float
    freeze: list[str]
    downloaded: int = 0
    from_cache: int = 0
    plugins: list[str] = field(default_factory=list)  # modules of the pytest11 entry points it installed


def _labels_of(client: docker.DockerClient, tag: str) -> tuple[list[str], list[str]]:
    """(pip freeze, plugin modules) recorded in an env image's labels (a layer built before plugins
    were recorded has none)."""
    labels = client.images.get(tag).labels or {}
    return (
        [x for x in (labels.get(FREEZE_LABEL) or "").split(";") if x],
        [x for x in (labels.get(PLUGINS_LABEL) or "").split(";") if x],
    )


def _ensure_cache_volume(client: docker.DockerClient, name: str) -> None:
    try:
        client.volumes.get(name)
    except NotFound:
        try:
            client.volumes.create(name, labels={"envforge.cache": "pip"})
        except APIError:
            pass  # created by another process meanwhile


def _lock_for(tag: str) -> threading.Lock:
    with _LOCKS_GUARD:
        return _BUILD_LOCKS.setdefault(tag, threading.Lock())


def build_env_image(
    client: docker.DockerClient,
    recipe: EnvRecipe,
    log: Log = lambda _: None,
    timeout_s: float = BUILD_TIMEOUT_S,
    cache_volume: str = PIP_CACHE_VOLUME,
    tag: str | None = None,
) -> EnvBuild:
    """Make sure the env image exists (one build per tag at a time in this process).

    `cache_volume` and `tag` exist for measurements: another pip cache (an empty one shows what a
    build without the shared cache costs) and another tag (a rebuild of the same recipe).
    """
    started = time.perf_counter()
    tag = tag or recipe.tag
    with _lock_for(tag):
        try:
            freeze, plugins = _labels_of(client, tag)
            return EnvBuild(tag, True, time.perf_counter() - started, freeze, plugins=plugins)
        except ImageNotFound:
            pass
        _ensure_cache_volume(client, cache_volume)
        log(f"building env layer {tag} on {recipe.parent}")
        try:
            container = client.containers.create(
                recipe.parent,
                command=["/bin/bash", f"{ENV_DIR}/build.sh"],
                user="0:0",
                working_dir="/",
                labels={OWNER_LABEL: owner_id(), "envforge.build": "env", "envforge.env": tag},
                volumes={cache_volume: {"bind": PIP_CACHE_DIR, "mode": "rw"}},
            )
        except ImageNotFound:
            raise ImageBuildError(f"env layer {tag}: parent image {recipe.parent} does not exist") from None
        except (APIError, DockerException) as exc:
            raise InfraError(
                "image_build_failed", f"env layer {tag}: cannot create the build container: {exc}"
            ) from None
        try:
            container.put_archive("/opt/envforge", _context_tar(recipe))
            container.start()
            status = container.wait(timeout=timeout_s)
            logs = container.logs().decode("utf-8", errors="replace")
            code = int(status.get("StatusCode", -1))
            for line in logs.splitlines()[-40:]:
                log(line)
            if code in (137, 143) or status.get("Error"):
                raise InfraError(
                    "image_build_killed", f"env layer {tag}: the build was killed (exit {code}); it is retried"
                )
            if code != 0:
                raise ImageBuildError(
                    f"env layer {tag}: build failed (exit {code}):\n" + "\n".join(logs.splitlines()[-25:])
                )
            freeze = _read_lines(container, "freeze.txt")
            plugins = [] if recipe.legacy else _read_lines(container, "plugins.txt")
            # A commit merges the container's labels into the image's: blank the build's own, or
            # every container made from this image (task builds, sandboxes) would claim its owner.
            container.commit(
                repository=tag.split(":")[0],
                tag=tag.split(":")[1],
                conf={
                    "Cmd": ["sleep", "infinity"],
                    "User": "sandbox",
                    "WorkingDir": WORKSPACE,
                    "Labels": {
                        "envforge.image": "env",
                        FREEZE_LABEL: ";".join(freeze),
                        PLUGINS_LABEL: ";".join(plugins),
                        OWNER_LABEL: "",
                        "envforge.build": "",
                        "envforge.env": "",
                    },
                },
            )
        except ReadTimeout:
            raise ImageBuildError(f"env layer {tag}: the build took longer than {timeout_s:.0f} s") from None
        except NotFound as exc:
            raise InfraError(
                "image_build_killed", f"env layer {tag}: the build container vanished ({exc}); it is retried"
            ) from None
        except (APIError, DockerException, OSError) as exc:
            raise InfraError("image_build_failed", f"env layer {tag}: {exc}") from None
        finally:
            try:
                container.remove(force=True, v=True)
            except (DockerException, OSError):
                pass  # the engine went away: orphan cleanup removes it once this process is gone
    downloaded = len(re.findall(r"^\s*Downloading \S+", logs, re.M))
    cached = len(re.findall(r"^\s*(Using cached|File was already downloaded) \S+", logs, re.M))
    return EnvBuild(tag, False, time.perf_counter() - started, freeze, downloaded, cached, plugins)


def _read_lines(container, name: str) -> list[str]:
    """The sorted lines of a file the build wrote in ENV_DIR (pip freeze, plugin modules)."""
    stream, _ = container.get_archive(f"{ENV_DIR}/{name}")
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
        member = tar.getmembers()[0]
        data = tar.extractfile(member).read().decode("utf-8", errors="replace")  # type: ignore[union-attr]
    return sorted(line.strip() for line in data.splitlines() if line.strip() and ";" not in line)


__all__ = [
    "ENV_REPO_PREFIX",
    "EnvBuild",
    "EnvRecipe",
    "PIP_CACHE_VOLUME",
    "PLUGINS_LABEL",
    "build_env_image",
    "env_recipe",
]
