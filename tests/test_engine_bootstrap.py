"""The Docker engine bootstrap script: idempotent and quick when the engine already runs."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "platform" / "deploy" / "docker-engine.sh"


@pytest.mark.docker
def test_bootstrap_is_idempotent_when_engine_runs(docker_client):
    started = time.perf_counter()
    proc = subprocess.run([str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "starting dockerd" not in proc.stderr  # nothing started a second engine
    assert time.perf_counter() - started < 30
    assert docker_client.ping()


def test_bootstrap_fails_with_a_clear_message_when_it_cannot_start(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "ENVFORGE_DOCKER_SOCKET": str(tmp_path / "nope.sock"),
           "ENVFORGE_DOCKER_WAIT_S": "1"}
    # Non-root without the engine: must refuse with what is missing and how to fix it.
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(SCRIPT)],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 1
    assert "ERROR:" in proc.stderr and "fix:" in proc.stderr
