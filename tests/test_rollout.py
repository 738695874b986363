"""Rollouts on real sandboxes: the replay policy end to end, malformed actions, policy
transport faults, containers killed mid-batch, and resume after SIGKILL of the runner."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from envforge.catalog import Catalog
from envforge.config import Settings
from envforge.rollout.batch import run_batch
from envforge.rollout.policies.base import PolicyError, PolicyOutput
from envforge.rollout.policies.replay import ReplayPolicy
from envforge.rollout.scheduler import RolloutConfig
from envforge.sandbox.engine import MANAGED_LABEL, OWNER_LABEL, owner_id
from envforge.sandbox.images import build_task_image
from envforge.sources import load_sources
from tests.conftest import REPO

pytestmark = pytest.mark.docker
SOURCES = [REPO / "task_sources" / "specs", REPO / "task_sources" / "runbooks"]


@pytest.fixture(scope="module")
def items(docker_client, base_image, tmp_path_factory):
    """The 8 bundled specs and runbooks with their images."""
    settings = Settings.from_env().with_data_dir(tmp_path_factory.mktemp("rollout-images"))
    tasks = [t for r in load_sources(SOURCES).values() for t in r.tasks]
    assert len(tasks) == 8
    return [(t, build_task_image(docker_client, t, base_image, settings).tag) for t in tasks]


def test_replay_rollouts_resolve_every_task_with_the_same_rewards_every_run(items, settings, docker_client):
    config = RolloutConfig(n_samples=2, concurrency=4)
    register = Catalog(settings.catalog_path).record_rollout_batch  # what the stages pass: the batch's catalog row
    first = run_batch(settings, items, ReplayPolicy(), config, "v-test", batch_id="det-1", client=docker_client,
                      register=register)
    second = run_batch(settings, items, ReplayPolicy(as_text=True), config, "v-test", batch_id="det-2",
                       client=docker_client, register=register)
    a, b = first.store.trajectories(), second.store.trajectories()
    assert len(a) == len(b) == 16
    assert all(t.resolved and t.reward == 1.0 and t.end_reason == "submitted" for t in a + b)
    key = lambda t: (t.task_id, t.sample_index)  # noqa: E731
    for x, y in zip(sorted(a, key=key), sorted(b, key=key)):
        vx, vy = dict(x.verification), dict(y.verification)
        for v in (vx, vy):
            v.pop("duration_s"), v.pop("logs")
        assert (x.reward, vx, x.final_diff, x.seed) == (y.reward, vy, y.final_diff, y.seed)
    assert first.metrics["pass_at_1"] == 1.0 and first.metrics["dropped_groups"] == 0
    assert first.metrics["pool_hit_rate"] > 0
    assert set(Catalog(settings.catalog_path).rollout_batches()["batch_id"]) == {"det-1", "det-2"}


class ScriptedPolicy:
    """Replies from a fixed script (text turns), then keeps repeating the last reply."""

    policy_id = "scripted"
    version = 0

    def __init__(self, replies: list[str]):
        self.replies = replies

    async def act(self, messages, tools, *, seed, temperature=1.0, max_tokens=512) -> PolicyOutput:
        turn = sum(1 for m in messages if m["role"] == "assistant")
        return PolicyOutput(text=self.replies[min(turn, len(self.replies) - 1)])

    async def aclose(self) -> None:
        return None


def test_malformed_actions_become_observations_and_the_trajectory_is_scored(items, settings, docker_client):
    task_image = [i for i in items if i[0].id == "inventory-median-even"]
    garbage = [
        "I think the bug is in stats.py",
        "<tool_call>{broken json</tool_call>",
        '<tool_call>{"name": "format_disk", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "write_file", "arguments": {"path": "x", "content": "' + "a" * 300_000 + '"}}</tool_call>',
        '<tool_call>{"name": "read_file", "arguments": {"path": "no/such/file"}}</tool_call>',
        '<tool_call>{"name": "run", "arguments": {"command": "python3 -m pytest -q tests 2>&1 | tail -1"}}</tool_call>',
        '<tool_call>{"name": "submit", "arguments": {}}</tool_call>',
    ]
    result = run_batch(settings, task_image, ScriptedPolicy(garbage), RolloutConfig(n_samples=1), "v", "bad-1",
                       client=docker_client)
    [t] = result.store.trajectories()
    assert [bool(x.parse_error) for x in t.turns] == [True, True, True, True, False, False, False]
    assert "no action found" in t.turns[0].observation and "unknown tool" in t.turns[2].parse_error
    assert "cannot read" in t.turns[4].observation and "2 failed, 6 passed" in t.turns[5].observation
    assert t.end_reason == "submitted" and t.reward == 0.0 and not t.resolved
    assert "malformed_actions:4" in t.failure_reasons
    # A policy that never submits runs out of turns, and is scored too.
    loop = ScriptedPolicy(['<tool_call>{"name": "run", "arguments": {"command": "true"}}</tool_call>'])
    result = run_batch(settings, task_image, loop, RolloutConfig(n_samples=1, max_turns=3), "v", "bad-2",
                       client=docker_client)
    [t] = result.store.trajectories()
    assert t.end_reason == "max_turns" and len(t.turns) == 3 and t.reward == 0.0


class FlakyTransport:
    """Replay, but the first call of every attempt fails like a dropped connection, `failures` times per sample;
    for `doomed` tasks it always fails."""

    policy_id = "flaky-replay"
    version = 0

    def __init__(self, failures: int, doomed: set[str]):
        self.failures, self.doomed = failures, doomed
        self.calls: dict[tuple[str, int], int] = {}
        self.replay = ReplayPolicy()

    def episode(self, task):
        inner = self.replay.episode(task)
        outer = self

        class Episode:
            policy_id, version = outer.policy_id, 0

            async def act(self, messages, tools, *, seed, temperature=1.0, max_tokens=512):
                key = (task.id, seed)
                if task.id in outer.doomed:
                    raise PolicyError("connection reset by peer")
                if sum(1 for m in messages if m["role"] == "assistant") == 0:
                    outer.calls[key] = outer.calls.get(key, 0) + 1
                    if outer.calls[key] <= outer.failures:
                        raise PolicyError("connection reset by peer")
                return await inner.act(messages, tools, seed=seed)

            async def aclose(self):
                return None
        return Episode()


def test_transport_faults_are_retried_and_an_exhausted_budget_drops_the_whole_group(items, settings, docker_client):
    doomed = items[0][0].id
    config = RolloutConfig(n_samples=2, concurrency=4, max_infra_retries=2, backoff_s=0.01)
    result = run_batch(settings, items, FlakyTransport(1, {doomed}), config, "v", "flaky-1", client=docker_client)
    stored = result.store.trajectories()
    assert len(stored) == 14 and {t.task_id for t in stored} == {t.id for t, _ in items} - {doomed}
    assert all(t.infra_retries == 1 and t.resolved for t in stored)
    [dropped] = result.store.dropped()
    assert dropped.task_id == doomed and "retry budget exhausted after 3 attempts" in dropped.reason
    assert result.metrics["dropped_groups"] == 1 and result.report.infra_retries == 14 + 2 * 2


def test_killing_containers_mid_batch_never_stores_a_partial_or_wrong_trajectory(items, settings, docker_client):
    """200 trajectories; about one container in ten is killed at a random moment while they run."""
    stop = threading.Event()
    killed: list[str] = []

    def killer() -> None:
        rng = random.Random(7)
        while not stop.is_set() and len(killed) < 20:
            time.sleep(rng.uniform(0.3, 1.5))
            running = docker_client.containers.list(filters={"label": [f"{MANAGED_LABEL}=1", f"{OWNER_LABEL}={owner_id()}"],
                                                             "status": "running"})
            if running:
                victim = rng.choice(running)
                try:
                    victim.kill()
                    killed.append(victim.id)
                except Exception:  # already gone
                    pass

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        config = RolloutConfig(n_samples=25, concurrency=8, max_infra_retries=4, backoff_s=0.05)
        result = run_batch(settings, items, ReplayPolicy(), config, "v", "chaos-1", client=docker_client)
    finally:
        stop.set()
        thread.join()
    assert len(killed) >= 10
    frame = result.store.frame()
    dropped = {g.task_id for g in result.store.dropped()}
    # Every group is complete or dropped as a whole; nothing is stored twice.
    counts = frame.group_by("task_id").len()
    assert all(n == 25 for n in counts["len"]) and not dropped & set(counts["task_id"])
    assert frame.height + 25 * len(dropped) == 200
    assert frame["trajectory_id"].n_unique() == frame.height
    # The replay policy solves every task: a stored failure would be an infra fault scored as a model failure.
    assert frame["resolved"].all() and (frame["reward"] == 1.0).all()
    assert (frame["end_reason"] == "submitted").all()
    assert result.report.infra_retries > 0
    assert result.store.pending() == []


def test_a_runner_killed_with_sigkill_resumes_without_redoing_or_duplicating(items, tmp_path, docker_client):
    data = tmp_path / "data"
    envforge = os.path.join(os.path.dirname(sys.executable), "envforge")
    env = {**os.environ, "MLFLOW_TRACKING_URI": ""}
    subprocess.run([envforge, "ingest", *map(str, SOURCES), "--data-dir", str(data)], check=True,
                   capture_output=True, env=env)
    cmd = [envforge, "rollout", "--task-set", "current", "--samples", "4", "--concurrency", "4", "--batch-id",
           "resume-1", "--json", "--data-dir", str(data)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
    batch_dir = data / "rollouts" / "resume-1"
    deadline = time.time() + 300
    while time.time() < deadline:
        done = list(batch_dir.glob("pending/*.json")) + list(batch_dir.glob("*.parquet"))
        if len(done) >= 3:
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    from envforge.rollout.store import TrajectoryStore
    before = TrajectoryStore(data / "rollouts", "resume-1")
    finished = {t.trajectory_id: t.started_at for t in before.trajectories() + before.pending()}
    assert 0 < len(finished) < 32
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    assert doc["resumed"] >= len(finished) and doc["stored_this_run"] + doc["resumed"] == 32
    after = TrajectoryStore(data / "rollouts", "resume-1").frame()
    assert after.height == 32 and after["trajectory_id"].n_unique() == 32
    again = {r["trajectory_id"]: r["started_at"] for r in after.iter_rows(named=True)}
    assert all(again[tid] == started for tid, started in finished.items())  # not redone
    assert after["resolved"].all()


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_model_policies_roll_out_with_tokens_and_logprobs(items, settings, docker_client, tmp_path):
    """A tiny model built from a config, served by `envforge policy serve` and used through the
    OpenAI-compatible client, and in-process: every turn records token ids and log-probs."""
    import urllib.request

    from envforge.rollout.policies.factory import make_policy
    from envforge.rollout.policies.tiny import build_tiny_model, save_pretrained_dir

    model_dir = save_pretrained_dir(*build_tiny_model(), tmp_path / "tiny")
    port = _free_port()
    envforge = os.path.join(os.path.dirname(sys.executable), "envforge")
    server = subprocess.Popen([envforge, "policy", "serve", str(model_dir), "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                assert server.poll() is None, server.stderr.read().decode()[-2000:]
                time.sleep(0.5)
        one = [i for i in items if i[0].id == "ops-service-config"]
        config = RolloutConfig(n_samples=2, concurrency=2, max_turns=2, max_tokens=16, temperature=1.0)
        for spec, batch in ((f"openai:http://127.0.0.1:{port}/v1", "http-1"), (f"hf:{model_dir}", "hf-1")):
            result = run_batch(settings, one, make_policy(spec), config, "v", batch, client=docker_client)
            trajectories = result.store.trajectories()
            assert len(trajectories) == 2
            for t in trajectories:
                assert len(t.turns) >= 1 and t.end_reason in ("max_turns", "submitted")
                for turn in t.turns:
                    assert turn.token_ids and len(turn.logprobs) == len(turn.token_ids)
                    assert all(lp <= 0 for lp in turn.logprobs) and turn.prompt_token_ids
            assert result.metrics["tokens"] > 0
            # Same seeds, same sampling: the two samples differ from each other but reproduce across policies.
            if batch == "http-1":
                http_tokens = {t.sample_index: t.turns[0].token_ids for t in trajectories}
            else:
                assert {t.sample_index: t.turns[0].token_ids for t in trajectories} == http_tokens
    finally:
        server.terminate()
        server.wait(timeout=30)
