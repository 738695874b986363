"""What a policy can cause from inside its sandbox is a model outcome, never an infrastructure
fault: a full /tmp, a huge file, its own OOM (the agent's included), a tool that fails. And a
reset sandbox is as clean as a fresh one, whatever the episode wrote (real Docker)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from envforge.errors import InfraError
from envforge.rollout.actions import ApplyPatch, Run, WriteFile, to_text
from envforge.rollout.batch import run_batch
from envforge.rollout.env import RolloutEnv
from envforge.rollout.policies.base import PolicyOutput
from envforge.rollout.config import RolloutConfig
from envforge.sandbox.container import Sandbox, SandboxOptions
from envforge.sandbox.pool import SandboxPool
from envforge.task import Limits
from envforge.verify.grader import Grader, options_for
from tests.conftest import BUNDLED_SPECS

pytestmark = pytest.mark.docker

FIXED_MEDIAN = ("    if len(ordered) % 2:\n        return ordered[mid]\n"
                "    return (ordered[mid - 1] + ordered[mid]) / 2\n")


class Scripted:
    """A policy acting out a fixed list of actions, then submitting."""

    policy_id = "scripted-hostile"
    version = 0

    def __init__(self, actions):
        self.actions = [to_text(a) for a in actions] + ['<tool_call>{"name": "submit", "arguments": {}}</tool_call>']

    async def act(self, messages, tools, *, seed, temperature=1.0, max_tokens=512) -> PolicyOutput:
        turn = sum(1 for m in messages if m["role"] == "assistant")
        return PolicyOutput(text=self.actions[min(turn, len(self.actions) - 1)])

    async def aclose(self) -> None:
        return None


@pytest.fixture(scope="module")
def inventory(bundled_images):
    return bundled_images["inventory-median-even"]


def _fixed_stats(task) -> str:
    source = (Path(task.base_dir) / "workspace" / "inventory" / "stats.py").read_text()
    return source.replace("    return ordered[mid]\n", FIXED_MEDIAN, 1)


def _one(settings, docker_client, inventory, actions, batch: str):
    result = run_batch(settings, [inventory], Scripted(actions), RolloutConfig(n_samples=1, max_infra_retries=1),
                       "v", batch, client=docker_client)
    assert result.report.dropped_groups == [] and result.report.infra_retries == 0, result.report.dropped_groups
    [traj] = result.store.trajectories()
    return traj


FILL_TMP = Run("dd if=/dev/zero of=/tmp/fill bs=1M 2>&1 | tail -n 1; df -k /tmp | tail -n 1")


def test_a_full_tmp_is_the_policys_own_business(settings, docker_client, inventory):
    """apply_patch after filling /tmp used to raise OSError out of the episode and kill the batch;
    a full /tmp used to make the final diff an infrastructure fault."""
    task, _ = inventory
    traj = _one(settings, docker_client, inventory,
                [FILL_TMP, ApplyPatch(task.reference_patch), WriteFile("inventory/stats.py", _fixed_stats(task))],
                "full-tmp")
    assert "No space left" in traj.turns[0].observation or "100%" in traj.turns[0].observation
    assert traj.turns[1].observation.startswith("error:") and "No space left" in traj.turns[1].observation
    assert traj.turns[2].observation.startswith("wrote")
    assert traj.resolved and traj.reward == 1.0 and traj.infra_retries == 0  # a full /tmp does not stop its diff


def test_files_the_policy_locked_from_itself_are_graded_not_an_infrastructure_fault(settings, docker_client,
                                                                                    inventory):
    """`chmod 000` on a file or a directory used to make `git add` fail: diff_failed, an
    "infrastructure fault" retried and then a dropped group (seen in the learning demo, where a
    sampled `chmod 0 run.sh` dropped 2 of 40 GRPO groups), a way for a failing policy to hide."""
    task, _ = inventory
    lock = Run("mkdir -p notes/deep && echo kept > notes/deep/todo.txt && chmod 000 notes/deep notes "
               "&& chmod 000 inventory/stats.py && ls -ld notes inventory/stats.py")
    traj = _one(settings, docker_client, inventory, [WriteFile("inventory/stats.py", _fixed_stats(task)), lock],
                "locked-files")
    assert "d---------" in traj.turns[1].observation and "----------" in traj.turns[1].observation
    assert traj.infra_retries == 0 and traj.resolved and traj.reward == 1.0, traj.failure_reasons
    assert "notes/deep/todo.txt" in traj.final_diff and "+kept" in traj.final_diff
    assert "inventory/stats.py" in traj.final_diff and "new mode" not in traj.final_diff  # no mode change to grade


def test_a_huge_file_scores_zero_with_the_reason(settings, docker_client, inventory):
    traj = _one(settings, docker_client, inventory,
                [Run("head -c 200M /dev/zero > blob.bin; ls -l blob.bin")], "huge-1")
    assert traj.reward == 0.0 and not traj.resolved
    assert any(r.startswith("diff_too_large") for r in traj.failure_reasons), traj.failure_reasons
    assert traj.final_diff == ""


def test_the_policys_memory_hog_dies_and_the_agent_lives(settings, docker_client, inventory):
    hog = "python3 -c 'b = bytearray(2000 << 20)'; echo exit=$?"
    traj = _one(settings, docker_client, inventory,
                [Run("cat /proc/self/oom_score_adj; sh -c 'cat /proc/self/oom_score_adj'"), Run(hog),
                 Run("echo still-here")], "oom-1")
    assert traj.turns[0].observation.split("stdout:\n")[1].split() == ["1000", "1000"]
    assert "exit=137" in traj.turns[1].observation
    assert "still-here" in traj.turns[2].observation  # the agent answered after the OOM
    assert traj.reward == 0.0 and traj.infra_retries == 0


def test_an_agent_killed_during_an_oom_is_the_commands_oom(docker_client, task_image):
    """Where a command lowered its own OOM priority and the agent became the victim, the host
    scores the OOM, not an infrastructure fault. The agent's death is simulated: a background
    hog is OOM-killed, and the agent is SIGKILLed while a command runs."""
    opts = SandboxOptions(limits=Limits(memory_mb=256, workspace_mb=32, tmp_mb=16, command_timeout_s=60))
    with Sandbox.start(docker_client, task_image, opts) as sb:
        agent_pid = sb._agent({"op": "ping"}, 10)["pid"]
        sb.exec("(python3 -c 'b = bytearray(600 << 20)' &); for i in $(seq 300); do "  # OOM-killed in the background
                "grep -q '^oom_kill [1-9]' /sys/fs/cgroup/memory/memory.oom_control && break; sleep 0.1; done")

        def kill_agent():
            time.sleep(1.0)
            sb.container.exec_run(["kill", "-9", str(agent_pid)], user="0")
        killer = threading.Thread(target=kill_agent)
        killer.start()
        res = sb.exec("sleep 20")
        killer.join()
        assert res.oom_killed and res.exit_code == 137 and sb.tainted == "oom"
        assert sb.exec("echo fallback").text() == "fallback\n"  # later commands go through docker exec
    with Sandbox.start(docker_client, task_image, opts) as sb:  # the same death without an OOM: infrastructure
        agent_pid = sb._agent({"op": "ping"}, 10)["pid"]
        killer = threading.Thread(target=lambda: (time.sleep(1.0), sb.container.exec_run(
            ["kill", "-9", str(agent_pid)], user="0")))
        killer.start()
        with pytest.raises(InfraError) as err:
            sb.exec("sleep 20")
        killer.join()
        assert err.value.cause == "agent_died"


def test_verify_exits_1_not_2_for_what_the_commands_did(tmp_path):
    from typer.testing import CliRunner

    from envforge.cli import app

    cmds = tmp_path / "cmds.sh"
    cmds.write_text("dd if=/dev/zero of=/tmp/fill bs=1M 2>/dev/null; true\nhead -c 200M /dev/zero > blob.bin; true\n")
    result = CliRunner().invoke(app, ["verify", "--task", str(BUNDLED_SPECS / "inventory-median-even"), "--commands",
                                      str(cmds), "--json", "--data-dir", str(tmp_path / "data")])
    assert result.exit_code == 1, result.output[-2000:]
    doc = json.loads(result.stdout.splitlines()[-1])
    assert doc["reward"] == 0.0 and doc["infra_error"] is None
    assert any(r.startswith("diff_too_large") for r in doc["reasons"])


WRITE_EVERYWHERE = r"""
echo ws > /workspace/planted; mkdir -p /workspace/d && chmod 000 /workspace/d
echo tmp > /tmp/planted; echo shm > /dev/shm/stats.py; echo run > /run/envforge/planted
python3 - <<'PY'
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmget(0x5eed, 4096, 0o1000 | 0o600)   # System V shared memory
libc.semget(0x5eed, 1, 0o1000 | 0o600)      # and a semaphore set
ctypes.CDLL("librt.so.1").mq_open(b"/planted", os.O_CREAT | os.O_RDWR, 0o600, None)
PY
(sleep 600 &)
"""
STATE = (r"cd / && for d in /workspace /tmp /dev/shm /dev/mqueue /run/envforge; do echo \"== $d\"; "
         r"find $d -mindepth 1 -printf '%P %y %m %s\n' | sort; done; "
         r"ipcs -m -s -q | grep -c '^0x' ; ps -o user= -e | grep -c sandbox")


def test_a_reset_sandbox_is_as_clean_as_a_fresh_one(docker_client, task_image):
    with SandboxPool(docker_client, max_idle_per_key=1) as pool:
        used = pool.acquire(task_image)
        assert used.exec(WRITE_EVERYWHERE).exit_code == 0
        dirty = used.exec(STATE).text()
        assert "planted" in dirty and "stats.py" in dirty
        pool.release(used)
        reset = pool.acquire(task_image)
        assert reset.id == used.id  # the same container, reset
        with Sandbox.start(docker_client, task_image) as fresh:
            assert reset.exec(STATE).text() == fresh.exec(STATE).text()
        pool.release(reset)


def test_a_diff_that_points_into_shared_memory_grades_the_same_reset_or_fresh(docker_client, inventory):
    """The policy leaves the fix in /dev/shm and a workspace symlink to it: graded on the reset
    container it ran in, it used to pass (1.0), on a fresh one fail (0.0)."""
    task, image = inventory
    with SandboxPool(docker_client, max_idle_per_key=1) as pool:
        sb = pool.acquire(image, options_for(task))
        sb.write_file("/dev/shm/stats.py", _fixed_stats(task))
        sb.exec("rm inventory/stats.py && ln -s /dev/shm/stats.py inventory/stats.py")
        diff = sb.diff()
        assert "/dev/shm/stats.py" in diff
        pool.release(sb)  # reset, kept warm
        pooled = Grader(docker_client, pool).grade(task, image, diff)
        assert pool.stats.hits >= 1  # graded in the container the policy used
    with Grader(docker_client) as fresh_grader:
        fresh = fresh_grader.grade(task, image, diff)
    assert pooled.comparable() == fresh.comparable() and pooled.reward == 0.0


def test_a_tool_that_fails_is_an_observation_never_an_escape():
    """Without Docker: a sandbox whose tools raise (what a policy's state can make them do)."""
    import asyncio

    class Broken:
        async def aexec(self, *a, **k):
            raise RuntimeError("exec exploded")

        def write_file(self, *a, **k):
            raise OSError("No space left on device")

        def apply_patch(self, *a, **k):
            raise OSError("write_file /tmp/x.patch: No space left on device")

    from envforge.sources.specs import load_spec_file

    task = load_spec_file(BUNDLED_SPECS / "inventory-median-even" / "task.yaml")
    env = RolloutEnv(pool=None, grader=None, task=task, image="x")  # type: ignore[arg-type]
    env.sandbox = Broken()  # type: ignore[assignment]
    env._deadline = time.monotonic() + 60

    async def steps():
        return [await env.step(a) for a in (Run("ls"), WriteFile("a", "b"), ApplyPatch("--- a/x\n+++ b/x\n"))]

    for obs, done, _ in asyncio.run(steps()):
        assert obs.error and obs.text.startswith("error:") and not done
