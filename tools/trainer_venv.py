"""Venvs of their own for the trainers that pin their own stack (verl, verifiers): they cannot share the
platform's venv (verl 0.9.1 pins transformers <5.11 and its own torch; verifiers pins openai, mcp, ...).

    python tools/trainer_venv.py verl|verifiers      # prints the venv's python

Each venv is built once and reused while its key holds: its requirements (and the files they name), the
client's pyproject and the interpreter; a change rebuilds it (verl ~7 min from the network here, 1.9 GB;
verifiers ~4 min, 610 MB). The client is installed from a copy of clients/python and reinstalled (no
deps, seconds) whenever its sources change, so a venv always runs the checkout's adapters. One build at a
time per venv (a lock file beside it): CI starts the builds in the background (.ci/run) and the tests
wait for them here.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLIENT = REPO / "clients" / "python"
KEY_FILE, CLIENT_KEY_FILE = ".envforge-key", ".envforge-client-key"


@dataclass(frozen=True)
class TrainerVenv:
    """One trainer's venv: what pip installs into it beside the client, and the client's extra."""

    name: str
    pip_args: tuple[str, ...]  # requirements, constraints (paths relative to the repository)
    client_extra: str = ""

    @property
    def path(self) -> Path:
        return REPO / f".venv-{self.name}"

    def named_files(self) -> list[Path]:
        """The requirement and constraint files pip reads (their content is part of the key)."""
        args = list(self.pip_args)
        return [REPO / args[i + 1] for i, arg in enumerate(args[:-1]) if arg in ("-r", "-c")]


VENVS = {
    # verl 0.9.1 and every version it resolves to (tools/verl/constraints.txt: the freeze of a venv built
    # from the requirements), CPU torch by name; the client without extras (verl comes from the requirements).
    "verl": TrainerVenv("verl", ("-c", "tools/verl/constraints.txt", "-r", "tools/verl/requirements.txt")),
    # verifiers 0.4 as the adapter was written against (the client's extra allows the 0.4 series); `uv`
    # too: verifiers' harnesses run their chat program as a uv script, whose dependencies uv fetches.
    "verifiers": TrainerVenv("verifiers", ("verifiers==0.4.0", "uv==0.13.9"), client_extra="[verifiers]"),
}


def isolated_env() -> dict[str, str]:
    """This process's environment for a command in a trainer venv: it sees only itself, since a caller's
    PYTHONPATH (a checkout's sources) would hide what the venv lacks."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def _digest(paths: list[Path], extra: list[str]) -> str:
    h = hashlib.sha256("\n".join(extra).encode())
    for path in paths:
        h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def venv_key(spec: TrainerVenv) -> str:
    """What the heavy install depends on."""
    return _digest([*spec.named_files(), CLIENT / "pyproject.toml"], [*spec.pip_args, spec.client_extra, sys.version])


def client_key() -> str:
    sources = sorted(p for p in (CLIENT / "src").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return _digest(sources, [])


def _pip(python: Path, *args: str, timeout_s: float) -> None:
    cmd = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout_s, env=isolated_env(), cwd=REPO, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")


def _install(python: Path, spec: TrainerVenv, client_only: bool, timeout_s: float) -> None:
    # the client from a copy: pip builds in the source tree (build/, *.egg-info), which should not be the checkout
    with tempfile.TemporaryDirectory() as tmp:
        source = shutil.copytree(
            CLIENT, Path(tmp) / "client", ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
        )
        if client_only:
            _pip(python, "--no-deps", "--force-reinstall", str(source), timeout_s=timeout_s)
        else:  # one resolution for the trainer and the client, so neither moves the other's pins
            _pip(python, *spec.pip_args, f"{source}{spec.client_extra}", timeout_s=timeout_s)


def ensure(name: str, timeout_s: float = 1800) -> Path:
    """The venv's python, building or refreshing the venv as needed (waits for a build in progress)."""
    spec = VENVS[name]
    with open(f"{spec.path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        python = spec.path / "bin" / "python"
        key = venv_key(spec)
        if not python.exists() or _read(spec.path / KEY_FILE) != key:
            shutil.rmtree(spec.path, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(spec.path)], check=True, timeout=120, env=isolated_env())
            _install(python, spec, client_only=False, timeout_s=timeout_s)
            (spec.path / CLIENT_KEY_FILE).write_text(client_key())
            (spec.path / KEY_FILE).write_text(key)  # last: a half-built venv is rebuilt next time
        elif _read(spec.path / CLIENT_KEY_FILE) != (current := client_key()):
            _install(python, spec, client_only=True, timeout_s=timeout_s)
            (spec.path / CLIENT_KEY_FILE).write_text(current)
        return python


def _read(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", choices=sorted(VENVS))
    args = parser.parse_args(argv)
    print(ensure(args.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
