"""envforge-client installs beside a trainer's own torch without touching it: a throwaway venv with
torch 2.13.0+cpu, then `pip install clients/python`; nothing installed before changes
version, and the client requires no torch, dagster or docker (nor envforge itself)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "python"
# The CPU build by name, so no index can hand pip a CUDA wheel (several GB) instead.
TRAINER_TORCH = "2.13.0+cpu"
PLATFORM_ONLY = {"torch", "dagster", "docker", "envforge"}


# The venv sees only itself: this process's PYTHONPATH (the checkout's sources) would hide what is missing.
_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def _run(args: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False, env=_ENV)


def _freeze(python: Path) -> dict[str, str]:
    """{normalized name: version} of every distribution in the venv (local tags like +cpu kept)."""
    code = (
        "import importlib.metadata as md, json, re; print(json.dumps({re.sub(r'[-_.]+', '-', "
        "d.metadata['Name']).lower(): d.version for d in md.distributions()}))"
    )
    return json.loads(_run([str(python), "-c", code]).stdout)


@pytest.mark.slow
def test_the_client_installs_beside_a_trainers_torch_and_changes_nothing(tmp_path):
    venv = tmp_path / "trainer"
    made = _run([sys.executable, "-m", "venv", str(venv)], timeout=120)
    if made.returncode != 0:
        pytest.skip(f"cannot build a throwaway venv: {made.stderr[-500:]}")
    python = venv / "bin" / "python"
    torch = _run([str(python), "-m", "pip", "install", "--quiet", f"torch=={TRAINER_TORCH}"])
    if torch.returncode != 0:
        pytest.skip(
            f"cannot install torch=={TRAINER_TORCH} into the throwaway venv (no CPU wheel in pip's "
            "find-links or indexes, e.g. https://download.pytorch.org/whl/cpu, or no network): "
            f"{torch.stderr[-800:]}"
        )
    before = _freeze(python)
    assert before["torch"] == TRAINER_TORCH

    # a copy: pip builds in the source tree (build/, *.egg-info), which should not be the checkout
    source = shutil.copytree(
        CLIENT, tmp_path / "client", ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".*_cache")
    )
    client = _run([str(python), "-m", "pip", "install", "--quiet", str(source)])
    assert client.returncode == 0, client.stderr[-3000:]
    after = _freeze(python)

    changed = {name: (v, after.get(name)) for name, v in before.items() if after.get(name) != v}
    assert not changed, f"installing the client changed what the trainer had: {changed}"
    assert after["envforge-client"] == "0.1.0"
    assert not PLATFORM_ONLY & (set(after) - set(before)), "the client pulled in part of the platform"

    probe = (
        "import importlib.metadata as md, importlib.util, json, envforge_client; "
        "print(json.dumps({'requires': md.requires('envforge-client'), "
        "'envforge': importlib.util.find_spec('envforge') is not None, "
        "'client': envforge_client.Client.__name__}))"
    )
    seen = json.loads(_run([str(python), "-c", probe]).stdout)
    required = {
        r.split(";")[0].split("[")[0].split("<")[0].split(">")[0].split("=")[0].strip().lower()
        for r in seen["requires"]
        if "extra ==" not in r  # a trainer's adapter extra (trl, openenv, verifiers) is opt-in
    }
    assert required == {"httpx", "pydantic", "tenacity"}
    assert not required & PLATFORM_ONLY and not seen["envforge"] and seen["client"] == "Client"
