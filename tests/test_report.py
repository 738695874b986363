"""The run report: one self-contained, escaped HTML page from the real catalog and MLflow store (no Docker)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

from envforge import track
from envforge.catalog import Catalog
from envforge.errors import Problem
from envforge.report import NOT_RUN
from envforge.sources import LoadResult
from envforge.stages.base import StageContext
from envforge.stages.configs import IngestConfig, ReportConfig, TaskSetConfig, TierConfig
from envforge.stages.ingest import ingest
from envforge.stages.report import report
from envforge.stages.task_set import Lineage, publish_task_set
from envforge.stages.tiers import tier_task_set
from envforge.tier_names import TIERS
from envforge.verify.gate import GateReport
from envforge.verify.strength import StrengthReport
from tests.conftest import BUNDLED_SPECS
from tests.test_observe_units import register_batches

EVIL = "<script>alert('pwned')</script> & <img src=x onerror=alert(1)>"


def _tiered_task_set(settings) -> tuple[str, list[dict]]:
    """Bundled specs ingested, one malicious reject, every task through the gate, a task set with static tiers."""
    ingest(settings, IngestConfig(), [BUNDLED_SPECS])
    cat = Catalog(settings.catalog_path)
    cat.ingest(LoadResult(rejects=[Problem("tickets/evil.yaml:7", "title", EVIL)]), source_kind="ticket",
               source_key="tickets/evil.yaml")
    tasks = cat.load_tasks()
    weak = StrengthReport(strength=0.3, strength_upper=0.3, mutants=10, killed=3, survived=7, overfittable=True,
                          f2p_strength=0.2, f2p_strength_upper=0.2, weak_form_passes=True,
                          survivors=[{"mutant": "boundary:stats.py:4", "operator": "boundary", "path": "stats.py",
                                      "line": 4, "change": "n < 2 -> n <= 2"}])
    cat.record_validations([GateReport(t.id, t.content_hash, True, runs=3, reference_passes=3, empty_fails=3,
                                       **({"strength": weak, "admission": "audit"} if i == 0 else {}))
                            for i, t in enumerate(tasks)], {})
    version = publish_task_set.tracked(settings, TaskSetConfig(), cat.accepted_tasks(), Lineage()).version
    tiers = tier_task_set.tracked(settings, TierConfig(eval_fraction=0.34), version)  # static tiers, histogram PNG
    assert tiers.chart.is_file()
    return version, tiers.rows


def build_run_report(settings, version: str | None, dagster_run_id: str | None = None):
    """The report stage as the CLI and the run_report asset call it (tracked: the page is kept in MLflow)."""
    return report.tracked(settings, ReportConfig(), version, context=StageContext(dagster_run_id=dagster_run_id)).report


def _log_training(settings, version: str) -> None:
    """What the sft, rl and evaluate stages record, without a model or a sandbox."""
    with track.mlflow_run(settings, "sft", "sft", {"task_set_version": version, "base_model": "tiny"}):
        for step in range(10):
            track.log_metrics({"sft_loss": 2.0 - 0.15 * step}, step=step)
        track.log_metrics({"sft_eval_loss": 1.1}, step=9)
    with track.mlflow_run(settings, "grpo", "rl", {"task_set_version": version, "rounds": 2}):
        for r, reward in enumerate((0.25, 0.625)):
            track.log_metrics({"rollout_mean_reward": reward, "rollout_pass_at_1": reward}, step=r)
    with track.mlflow_run(settings, "evaluation", "evaluation", {"task_set_version": version}):
        track.log_json({"task_set_version": version, "eval_tasks": 2, "phases": {
            "before": {"pass_at_1": 0.0, "by_tier": {"easy": 0.0}, "by_source": {"spec": 0.0}},
            "after SFT": {"pass_at_1": 0.5, "by_tier": {"easy": 0.5}, "by_source": {"spec": 0.5}},
            "after RL": {"pass_at_1": 0.875, "by_tier": {"easy": 0.875}, "by_source": {"spec": 0.875}}}},
            "evaluation_report.json")


def _self_contained(html: str) -> None:
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I)
    assert "<script" not in html.lower() and "<link" not in html.lower()
    assert all(src.startswith("data:image/png;base64,") for src in re.findall(r'<img src="([^"]*)"', html))


def test_report_of_a_tiered_task_set(settings):
    version, rows = _tiered_task_set(settings)
    cat = Catalog(settings.catalog_path)
    cat.record_rollout_batch({
        "batch_id": "batch-1", "task_set_version": version, "policy_id": "replay", "location": "/tmp/rollouts",
        "n_tasks": len(rows), "n_samples": 4, "n_trajectories": 4 * len(rows), "n_dropped_groups": 1,
        "pass_at_1": 0.5, "metrics_json": '{"pass_at_1": 0.5, "pass_at_4": 0.75, "infra_retries": 2.0, '
                                          '"steps_per_s": 12.5}'})

    register_batches(settings, settings.data_dir / "rollouts", version)  # two real stores: 3/3 solved, then 1/3

    report = build_run_report(settings, version, dagster_run_id="dagster-run-42")

    assert report.task_set_version == version
    assert report.path.parent == settings.data_dir / "reports"
    assert report.path.name.startswith(f"run-report-{version[:12]}-") and report.path.suffix == ".html"
    html = report.path.read_text()
    assert report.latest.read_text() == html
    _self_contained(html)
    assert html.count("<img ") >= 2  # the tier and strength histograms, inlined
    # the card: version, tier counts in TIERS order, splits
    assert version in html
    counts = "".join(f'<td class="n">{sum(r["tier"] == t for r in rows)}</td>' for t in TIERS)
    assert counts in html
    for split in ("train", "eval"):
        assert f"<b>{sum(r['split'] == split for r in rows)}</b><span>{split} split</span>" in html
    # verifier strength: in the card (the weak task only in the audit split) and in the gates
    assert [r["split"] for r in rows if r["task_id"] == Catalog(settings.catalog_path).load_tasks()[0].id] == ["audit"]
    assert '<td class="n">0.30; F2P 0.20 (overfittable, weak FAIL_TO_PASS asserts, audit only)</td>' in html
    assert "<b>1</b><span>FAIL_TO_PASS tests that accept a wrong value (weak-form probe)</span>" in html
    assert "<b>1</b><span>tasks measured</span>" in html and "stats.py:4 n &lt; 2 -&gt; n &lt;= 2" in html
    # gates and rollouts
    assert "tickets/evil.yaml" in html and "batch-1" in html and "0.750" in html
    # the health verdict of each batch against the one before it (envforge.observe.health)
    health = html[html.index('id="health"'):]
    health = health[:health.index("</section>")]
    assert health.count("<tr>") == 4  # header + 3 batches
    assert '<span class="chip bad">policy regression</span>' in health
    assert "pass@1 on 3 cleanly-run tasks 1.000 -&gt; 0.333" in health
    # untrusted data is escaped, never markup
    assert "<script>alert" not in html and "onerror=alert(1)>" not in html
    assert "&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt; &amp; &lt;img src=x onerror=alert(1)&gt;" in html
    # stages that have not run say so
    assert report.sections["sft"] is False and report.sections["rl"] is False
    assert report.sections["gate_images"] is False and report.sections["task_set"] is True
    assert html.count(NOT_RUN) >= 4 and "no SFT run for this task-set version" in html
    assert "dagster-run-42" in html and report.mlflow_run_id in html
    # logged to MLflow: a `report` run with the Dagster run id and the HTML as an artifact
    client = mlflow.MlflowClient(tracking_uri=settings.mlflow_tracking_uri)
    run = client.get_run(report.mlflow_run_id)
    assert run.data.tags[track.STAGE_TAG] == "report" and run.data.tags[track.DAGSTER_RUN_TAG] == "dagster-run-42"
    assert [a.path for a in client.list_artifacts(report.mlflow_run_id, "report")] == [f"report/{report.path.name}"]
    assert run.data.metrics["report_rejects"] == 1

    # after training: SFT, GRPO and the evaluation appear, with the training curves
    _log_training(settings, version)
    again = build_run_report(settings, Catalog(settings.catalog_path).resolve_task_set(version[:8]))
    html = again.path.read_text()
    _self_contained(html)
    assert again.sections["sft"] and again.sections["rl"] and again.sections["evaluation"]
    assert "no SFT run" not in html and "0.875" in html and "0.625" in html
    assert html.count("<img ") >= 4  # tiers, training curves, pass@1 per tier and per source


def test_report_before_any_task_set_and_cli(tmp_path):
    data = tmp_path / "data"
    env = {**os.environ, "ENVFORGE_DATA_DIR": str(data)}
    env.pop("MLFLOW_TRACKING_URI", None)
    envforge = str(Path(sys.executable).with_name("envforge"))
    proc = subprocess.run([envforge, "report", "--open-path"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    url = proc.stdout.strip()
    assert url.startswith("file://") and "run-report-no-task-set-" in url
    html = (data / "reports" / "latest.html").read_text()
    _self_contained(html)
    assert "no task set in the catalog" in html and html.count(NOT_RUN) >= 6


def test_unknown_version_is_an_error(settings):
    from envforge.report import report_version

    with pytest.raises(ValueError, match="matches 0 versions"):
        report_version(Catalog(settings.catalog_path), "0123abcd")
    assert report_version(Catalog(settings.catalog_path), "latest") is None  # no task set yet: the report says so


def test_run_report_asset(settings):
    import dagster as dg

    from assets.defs.reporting.assets import run_report
    from assets.defs.resources import default_resources

    result = dg.materialize([run_report], resources=default_resources(settings),
                            instance=dg.DagsterInstance.ephemeral())
    assert result.success
    meta = result.asset_materializations_for_node("run_report")[0].metadata
    path = Path(meta["path"].value)
    assert path.is_file() and path.parent == settings.data_dir / "reports"
    assert meta["task_set_version"].value == "" and meta["sections_run"].value == 0
    assert result.run_id in path.read_text()  # the Dagster run id, on the page and on the MLflow run
    run_id = re.search(r"/runs/(\w+)$", meta["mlflow_run"].value).group(1)
    run = mlflow.MlflowClient(tracking_uri=settings.mlflow_tracking_uri).get_run(run_id)
    assert run.data.tags[track.DAGSTER_RUN_TAG] == result.run_id
