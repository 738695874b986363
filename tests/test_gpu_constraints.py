"""The `gpu` extra resolves against constraints-gpu.txt (checked on CPU, with pip's resolver and PyPI).

vLLM pins its own torch and caps transformers, so the GPU stack cannot share the CPU venv's
constraints.txt; constraints-gpu.txt is its own lock. These tests check the lock file against
the project's metadata offline, and then let pip resolve `envforge[gpu]` against it
(`pip install --dry-run --ignore-installed --report`: metadata only, nothing installed). The
resolution needs PyPI; without it the test is skipped and says so.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
GPU_CONSTRAINTS = REPO / "constraints-gpu.txt"
CLIENT = REPO / "clients" / "python"  # envforge-client: installed from the checkout, not pinned
LOCAL = {"envforge", "envforge-client"}


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{path.name}: {line!r} is not pinned with =="
            pins[canonicalize_name(name)] = version.strip()
    return pins


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_gpu_lock_satisfies_the_project_and_differs_where_vllm_needs_it():
    gpu, cpu = _pins(GPU_CONSTRAINTS), _pins(REPO / "constraints.txt")
    project = _project()
    for spec in [*project["dependencies"], *project["optional-dependencies"]["gpu"]]:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        if name in LOCAL:
            continue
        assert name in gpu, f"constraints-gpu.txt: no pin for {req.name} ({spec} in pyproject.toml)"
        assert req.specifier.contains(gpu[name], prereleases=True), \
            f"constraints-gpu.txt: {req.name}=={gpu[name]} does not satisfy pyproject.toml's {spec!r}"
        if name in cpu:  # the CPU lock satisfies the core dependencies too
            assert name == "vllm" or req.specifier.contains(cpu[name], prereleases=True), (req.name, cpu[name])
    assert gpu["vllm"].startswith("0.33.") and gpu["torch"] == "2.14.0"
    assert tuple(int(x) for x in gpu["transformers"].split(".")[:2]) < (5, 21)
    assert cpu["torch"] == "2.13.0" and "vllm" not in cpu


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


@pytest.mark.slow
def test_gpu_extra_resolves_with_pip(tmp_path):
    if not _pypi_reachable():
        pytest.skip("PyPI (pypi.org:443) is unreachable: cannot resolve the gpu extra's metadata")
    # the project's metadata only (pyproject + readme), so the build leaves nothing in the checkout
    project = tmp_path / "envforge"
    (project / "platform" / "envforge").mkdir(parents=True)
    (project / "platform" / "envforge" / "__init__.py").write_text("")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, project / name)
    client = shutil.copytree(CLIENT, tmp_path / "client", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--report", str(report), "-c", str(GPU_CONSTRAINTS), str(client), f"{project}[gpu]"],
        capture_output=True, text=True, timeout=1500, check=False, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    resolved = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
                for i in json.loads(report.read_text())["install"]}
    assert resolved["vllm"].startswith("0.33.") and resolved["torch"] == "2.14.0"
    pins = _pins(GPU_CONSTRAINTS)
    unpinned = sorted(set(resolved) - set(pins) - LOCAL)
    assert not unpinned, f"constraints-gpu.txt misses {unpinned}: regenerate it (see its header)"
    assert all(resolved[n] == pins[n] for n in resolved if n in pins)
