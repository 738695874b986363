"""The verifiers venv: verifiers 0.4 and envforge-client[verifiers] in their own venv (`.venv-verifiers/`),
since verifiers pins its own stack (openai, mcp, transformers, ...) and must not move the platform's.

    python tools/verifiers_venv.py [--venv .venv-verifiers]    # prints the venv's python

Built once and reused while its key holds: the requirements below and the client's pyproject (a change
rebuilds it, ~4 min here). The client itself is reinstalled (no deps, seconds) whenever its sources
change, so the venv always runs the checkout's adapter. `uv` is installed too: verifiers' harnesses run
their chat program as a uv script, which `uv` fetches the dependencies of (openai, mcp) on first use.
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLIENT = REPO / "clients" / "python"
VENV = REPO / ".venv-verifiers"
# What the adapter was written and tested against; the client's extra allows the 0.4 series.
REQUIREMENTS = ["verifiers==0.4.0", "uv==0.13.9"]
KEY_FILE, CLIENT_KEY_FILE = ".envforge-key", ".envforge-client-key"
# The venv sees only itself: a caller's PYTHONPATH (a checkout's sources) would hide what is missing.
ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def _digest(paths: list[Path], extra: list[str]) -> str:
    h = hashlib.sha256("\n".join(extra).encode())
    for path in paths:
        h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def venv_key() -> str:
    """What the heavy install depends on: the requirements, the client's pyproject, the interpreter."""
    return _digest([CLIENT / "pyproject.toml"], [*REQUIREMENTS, sys.version])


def client_key() -> str:
    sources = sorted(p for p in (CLIENT / "src").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return _digest(sources, [])


def _pip(python: Path, *args: str, timeout_s: float) -> None:
    cmd = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=ENV, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")


def _install_client(python: Path, extra: str, no_deps: bool, timeout_s: float) -> None:
    # from a copy: pip builds in the source tree (build/, *.egg-info), which should not be the checkout
    with tempfile.TemporaryDirectory() as tmp:
        source = shutil.copytree(
            CLIENT, Path(tmp) / "client", ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
        )
        args = ["--no-deps", "--force-reinstall"] if no_deps else []
        _pip(python, *args, f"{source}{extra}", timeout_s=timeout_s)


def ensure(venv: Path = VENV, timeout_s: float = 1200) -> Path:
    """The venv's python, building or refreshing the venv as needed (one build at a time: CI starts it in
    the background, .ci/run, and the test waits for it here)."""
    with open(f"{venv}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure(venv, timeout_s)


def _ensure(venv: Path, timeout_s: float) -> Path:
    python = venv / "bin" / "python"
    key = venv_key()
    if not python.exists() or _read(venv / KEY_FILE) != key:
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, env=ENV)
        _pip(python, *REQUIREMENTS, timeout_s=timeout_s)
        _install_client(python, "[verifiers]", no_deps=False, timeout_s=timeout_s)
        (venv / CLIENT_KEY_FILE).write_text(client_key())
        (venv / KEY_FILE).write_text(key)  # last: a half-built venv is rebuilt next time
    elif _read(venv / CLIENT_KEY_FILE) != (current := client_key()):
        _install_client(python, "", no_deps=True, timeout_s=timeout_s)
        (venv / CLIENT_KEY_FILE).write_text(current)
    return python


def _read(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, default=VENV)
    args = parser.parse_args(argv)
    print(ensure(args.venv.resolve()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
