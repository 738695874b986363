"""Reference solutions run in real containers: the reference resolves, the empty solution fails."""

from __future__ import annotations

import pytest

from envforge.sandbox.container import Sandbox, SandboxOptions
from envforge.sandbox.images import build_task_image
from envforge.sources import load_specs
from envforge.verify.solutions import run_solution
from tests.conftest import BUNDLED_SPECS

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def bundled_images(docker_client, base_image, tmp_path_factory):
    from envforge.config import Settings

    settings = Settings.from_env().with_data_dir(tmp_path_factory.mktemp("data"))
    tasks = load_specs([BUNDLED_SPECS]).tasks
    return {t.id: (t, build_task_image(docker_client, t, base_image, settings).tag) for t in tasks}


@pytest.mark.parametrize("task_id", ["inventory-median-even", "ops-service-config", "orders-daily-summary"])
def test_reference_resolves_and_empty_fails(docker_client, bundled_images, task_id):
    task, image = bundled_images[task_id]
    ref = run_solution(docker_client, task, image, "reference")
    assert ref.resolved and ref.reward == 1.0 and ref.reasons == [], ref
    empty = run_solution(docker_client, task, image, "empty")
    assert not empty.resolved and empty.reward == 0.0 and empty.reasons
    if task.spec.verification.tests:
        f2p = task.spec.verification.tests.fail_to_pass
        assert all(ref.tests[t] == "passed" for t in ref.tests)
        assert {f"test_failed:{t}" for t in f2p} <= set(empty.reasons)
        assert ref.patch_method == "git_apply"


def test_no_containers_left_behind(docker_client, bundled_images):
    task, image = bundled_images["orders-daily-summary"]
    run_solution(docker_client, task, image, "reference")
    leftovers = docker_client.containers.list(all=True, filters={"label": "envforge.task=orders-daily-summary"})
    assert leftovers == []


def test_sandbox_isolation_basics(docker_client, bundled_images):
    _, image = bundled_images["inventory-median-even"]
    with Sandbox.start(docker_client, image, SandboxOptions()) as sb:
        assert sb.exec("id -u").text().strip() == "1000"
        assert sb.exec("touch /usr/x").exit_code != 0  # read-only root filesystem
        net = sb.exec("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)\"")
        assert net.exit_code != 0  # no network
        assert sb.exec("test -e /var/run/docker.sock").exit_code != 0
        assert sb.exec("grep -c . /proc/self/status >/dev/null && grep CapEff /proc/self/status").text().split()[1] \
            == "0000000000000000"
        assert sb.exec("env").text().count("=") < 15 and "DOCKER" not in sb.exec("env").text()
        ls = sb.exec("ls inventory tests").text()
        assert "stats.py" in ls and "test_stats.py" in ls


def test_exec_timeout_and_output_cap(docker_client, bundled_images):
    _, image = bundled_images["inventory-median-even"]
    with Sandbox.start(docker_client, image, SandboxOptions(output_cap=1000)) as sb:
        slow = sb.exec("sleep 30", timeout_s=1)
        assert slow.timed_out and slow.duration_s < 10
        big = sb.exec("head -c 5000 /dev/zero")
        assert len(big.stdout) == 1000 and big.stdout_truncated
        sb.write_file("/workspace/data/in.txt", b"\x00\x01binary\n")
        assert sb.read_file("/workspace/data/in.txt") == b"\x00\x01binary\n"
        sb.write_file("/workspace/inventory/stats.py", "changed\n")
        diff = sb.diff()
        assert "data/in.txt" in diff and "+changed" in diff


def test_patch_that_does_not_apply_is_reported(docker_client, bundled_images):
    _, image = bundled_images["inventory-median-even"]
    with Sandbox.start(docker_client, image) as sb:
        with pytest.raises(ValueError, match="patch does not apply: git_apply"):
            sb.apply_patch("--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n")
        assert sb.exec("git status --porcelain").text() == ""  # nothing half-applied
