"""TRL's GRPOTrainer drives envforge environments over HTTP, both ways TRL offers: `environment_factory`
(examples/trl_env_factory_envforge.py) and `rollout_func` (examples/trl_grpo_envforge.py); tiny model, CPU."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

from envforge.catalog import Catalog

pytestmark = [pytest.mark.docker, pytest.mark.slow]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def _recorded(service_data, tenant: str, n: int):
    """The tenant's sessions as the service recorded them (written in the background)."""
    catalog = Catalog(service_data.settings.catalog_path)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and catalog.service_sessions(tenant).height < n:
        time.sleep(0.5)
    return catalog.service_sessions(tenant)


def test_environment_factory_step_is_rewarded_by_the_verifier(live_server, service_data, monkeypatch, tmp_path):
    from envforge_client import Client
    from tests.service.conftest import create_key

    key = create_key(service_data.settings, "trl-env", ["main"], max_sessions=4)
    monkeypatch.setenv("ENVFORGE_API_KEY", key)
    # The tiny model's sampling is biased (GRPOConfig.generation_kwargs) to write a fix and a submit as two
    # tool calls: TRL's tool loop calls EnvforgeToolEnv.run/.submit, the sandbox runs them, the verifier grades.
    summary = _example("trl_env_factory_envforge").main(
        ["--url", live_server.url, "--task", "inventory-median-even", "--bias-toward", "fix-median",
         "--steps", "1", "--generations", "2", "--max-tool-calls", "1", "--out", str(tmp_path / "grpo")])
    episodes = summary["episodes"]
    assert len(episodes) == 2
    assert all(e["turns"] == 2 and e["submitted"] and e["resolved"] and e["reward"] == 1.0 for e in episodes)
    logged = [row for row in summary["log"] if "loss" in row][0]
    assert logged["rewards/EnvforgeToolEnv/mean"] == 1.0 and logged["tools/call_frequency"] == 2.0
    assert logged["tools/failure_frequency"] == 0.0
    # Every session was closed, and the service's own record of each graded session is the trainer's reward.
    # (this tenant's: the live server is shared with the other service tests, which may hold sessions of their own)
    with Client(live_server.url, key) as client:
        assert client.http.get("/sessions").json()["sessions"] == []
    rows = _recorded(service_data, "trl-env", 2)
    assert set(rows["session_id"]) == {e["session_id"] for e in episodes}
    assert rows["reward"].to_list() == [1.0, 1.0] and set(rows["end_reason"]) == {"submitted"}


def test_rollout_func_step_batches_turns_across_episodes(live_server, service_data, monkeypatch, tmp_path):
    from tests.service.conftest import create_key

    key = create_key(service_data.settings, "trl-team", ["main"], max_sessions=4)
    monkeypatch.setenv("ENVFORGE_API_KEY", key)
    summary = _example("trl_grpo_envforge").main(
        ["--url", live_server.url, "--task-set", "main", "--steps", "1", "--generations", "2",
         "--max-turns", "2", "--max-new-tokens", "16", "--out", str(tmp_path / "grpo")])
    episodes = summary["episodes"]
    assert len(episodes) == 2 and all(e["turns"] == 2 for e in episodes)
    assert summary["generate_calls"] == [2, 2]  # each turn one generation for both episodes
    assert all(e["reward"] == 0.0 for e in episodes)  # random weights: nothing gets solved
    logged = [row for row in summary["log"] if "loss" in row]
    assert logged and "rewards/envforge_reward/mean" in logged[0]
    # Every episode was a real session on the service, recorded under the tenant.
    rows = _recorded(service_data, "trl-team", 2)
    assert set(rows["session_id"]) == {e["session_id"] for e in episodes}
