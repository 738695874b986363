"""TRL's GRPOTrainer drives envforge environments over HTTP (examples/trl_grpo_envforge.py, tiny model, CPU)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from envforge.catalog import Catalog

pytestmark = [pytest.mark.docker, pytest.mark.slow]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_grpo_envforge.py"


def test_grpo_trainer_trains_a_step_on_service_episodes(live_server, service_data, monkeypatch, tmp_path):
    from tests.service.conftest import create_key

    key = create_key(service_data.settings, "trl-team", ["main"], max_sessions=4)
    monkeypatch.setenv("ENVFORGE_API_KEY", key)
    spec = importlib.util.spec_from_file_location("trl_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    summary = example.main(["--url", live_server.url, "--task-set", "main", "--steps", "1", "--generations", "2",
                            "--max-turns", "2", "--max-new-tokens", "16", "--out", str(tmp_path / "grpo")])
    episodes = summary["episodes"]
    assert len(episodes) == 2 and all(1 <= e["turns"] <= 2 for e in episodes)
    assert all(e["reward"] == 0.0 for e in episodes)  # random weights: nothing gets solved
    logged = [row for row in summary["log"] if "loss" in row]
    assert logged and "rewards/envforge_reward/mean" in logged[0]
    # Every episode was a real session on the service, recorded under the tenant.
    catalog = Catalog(service_data.settings.catalog_path)
    import time
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and catalog.service_sessions("trl-team").height < 2:
        time.sleep(0.5)
    assert set(catalog.service_sessions("trl-team")["session_id"]) == {e["session_id"] for e in episodes}
