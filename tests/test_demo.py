"""`envforge demo`: the whole asset graph on the bundled examples, in a persistent Dagster instance.

The shortened demo (`--quick`: fewer gate runs, samples and training steps) walks the same graph
as `make demo`; afterwards the instance a `make ui` would open must show every asset materialized
and every check passing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ENVFORGE = str(Path(sys.executable).with_name("envforge"))


@pytest.mark.docker
@pytest.mark.slow  # about 5 min
def test_demo_materializes_the_whole_graph(tmp_path, docker_client):
    data, home = tmp_path / "data", tmp_path / "dagster"
    env = {**os.environ, "ENVFORGE_DATA_DIR": str(data), "DAGSTER_HOME": str(home)}
    env.pop("MLFLOW_TRACKING_URI", None)  # the data directory's own store, read back below
    proc = subprocess.run([ENVFORGE, "demo", "--quick", "--json", str(tmp_path / "summary.json")], env=env,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-5000:] + proc.stdout[-3000:]
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc == json.loads((data / "demo_summary.json").read_text())
    stages = doc["stages"]
    # 3 specs, 5 runbooks, 12 tickets, 3 reviews, 3 SWE-bench instances; 9 bad records kept with reasons.
    assert stages["ingest"]["valid"] == 26 and stages["ingest"]["rejected"] == 9
    assert all(r["source"] and r["reason"] for r in stages["ingest"]["rejects"])
    assert stages["quality"] == {"in": 26, "clean": 26, "contaminated": 0, "duplicates": 0}
    assert stages["gate"]["accepted"] == 26 and stages["gate"]["quarantined"] == 0
    tiers = stages["tiers"]
    assert sum(tiers["histogram"].values()) == 26 and tiers["splits"]["train"] > tiers["splits"]["eval"] > 0
    rollouts = stages["rollouts"]
    assert rollouts["trajectories"] == 26 * 2 and rollouts["pass_at_1"] == 1.0 and rollouts["dropped_groups"] == 0
    training = stages["training"]
    assert training["sft_final_loss"] < training["sft_first_loss"]
    assert set(training["pass_at_1"]) == {"before", "after SFT", "after RL"}
    assert Path(doc["report"]).is_file() and Path(doc["report"]).parent == data / "reports"
    assert [r["job"] for r in doc["runs"]][-3:] == ["main_job", "rollout_job", "report_job"]
    # What the UI shows afterwards, read back from the instance on disk.
    # every asset materialized, but a source kind nothing bundled uses (history: a team's own repository)
    assert {k for k, v in doc["graph"]["assets"].items() if v != "materialized"} == {"history_tasks"}
    assert doc["graph"]["assets"]["history_tasks"] == "no sources"
    assert {"rl_checkpoint", "evaluation_report", "run_report", "rollout_batch", "spec_tasks"} <= set(
        doc["graph"]["assets"])
    assert {v for k, v in doc["graph"]["checks"].items() if not k.startswith("history_tasks")} == {"passed"}, \
        doc["graph"]["checks"]
    assert len(doc["graph"]["checks"]) >= 10
    for text in ("Tier histogram", "assets materialized", "make ui", "make mlflow-ui", "HTML report"):
        assert text in proc.stdout
    assert (home / "dagster.yaml").is_file() and (home / "history").is_dir()
    # Every stage of a run logged an MLflow run tagged with that Dagster run id, in the data directory's store;
    # the checkpoints are registered, the RL one with alias `best`.
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{data / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("envforge").experiment_id
    run_ids = {r["job"]: r["run_id"] for r in doc["runs"]}

    def stages_of(job: str) -> set[str]:
        runs = client.search_runs([experiment], f"tags.`dagster.run_id` = '{run_ids[job]}'")
        return {r.data.tags["envforge.stage"] for r in runs}

    assert stages_of("main_job") == {"quality", "images", "validate", "task_set", "tiers", "sft", "rl", "evaluation",
                                     "report"}
    assert stages_of("rollout_job") == {"rollout"} and stages_of("report_job") == {"report"}
    assert client.get_model_version_by_alias("envforge-policy", "best").source
    assert client.search_model_versions("name='envforge-policy-sft'")
    version = stages["tiers"]["version"]
    assert (data / "checkpoints" / f"sft-{version[:12]}").is_dir() and (data / "checkpoints" / f"rl-{version[:12]}").is_dir()
