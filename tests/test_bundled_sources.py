"""The bundled sources end to end: `envforge ingest` and the Dagster source assets yield every
valid task, each task's reference solution passes and the empty solution fails in a real
sandbox, and every deliberately bad record is rejected with its precise reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from envforge.catalog import Catalog
from envforge.config import Settings
from tests.conftest import REPO

pytestmark = pytest.mark.docker

SOURCES = REPO / "task_sources"
# (file suffix, record, field, words the reason must contain)
EXPECTED_REJECTS = {
    ("runbooks/disk-cleanup-no-checks.md", "", "Checks", "needs a '## Checks' section"),
    ("swebench/instances.jsonl", "4", "patch", "does not apply to base_commit"),
    ("swebench/instances.jsonl", "5", "problem_statement", "required field is missing"),
    ("tickets/jira-export.jsonl", "8", "fields.summary", "required field is missing"),
    ("tickets/jira-export.jsonl", "9", "fields.customfield_10042", "does not exist in the repository"),
    ("tickets/github-issues.csv", "row 6", "closed_by_commit", "changes no test files"),
    ("tickets/github-issues.csv", "row 7", "closed_by_commit", "no failing-then-passing test"),
    ("reviews/reviews.jsonl", "4", "comment", "required field is missing"),
    ("reviews/reviews.jsonl", "5", "follow_up_commit", "does not exist in the repository"),
}


def _matches(reject: dict, expected: tuple[str, str, str, str]) -> bool:
    suffix, record, field, words = expected
    return (reject["source"].endswith(suffix) and reject["record"] == record and reject["field"] == field
            and words in reject["reason"])


@pytest.fixture(scope="module")
def ingested(tmp_path_factory, docker_client):
    data = tmp_path_factory.mktemp("bundled-ingest")
    envforge = os.path.join(os.path.dirname(sys.executable), "envforge")
    paths = [str(p) for p in Settings.from_env().bundled_sources()]
    proc = subprocess.run([envforge, "ingest", *paths, "--json", "--data-dir", str(data)], capture_output=True,
                          text=True, timeout=1200, env={**os.environ, "MLFLOW_TRACKING_URI": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return data, json.loads(proc.stdout)


def test_cli_ingest_yields_every_valid_task_and_every_precise_reject(ingested):
    data, doc = ingested
    assert doc["valid"] == 26 and doc["by_kind"] == {"review": 3, "runbook": 5, "spec": 3, "swebench": 3,
                                                     "ticket": 12}
    assert doc["rejected"] == len(EXPECTED_REJECTS) == len(doc["rejects"])
    for expected in EXPECTED_REJECTS:
        assert any(_matches(r, expected) for r in doc["rejects"]), (expected, doc["rejects"])
    catalog = Catalog(data / "catalog.duckdb")
    assert catalog.tasks().height == 26
    stored = catalog.current_rejects()
    assert stored.height == len(EXPECTED_REJECTS)
    assert set(stored["source_kind"]) == {"runbook", "swebench", "ticket", "review"}
    loads = catalog.source_loads()
    assert loads.filter(loads["source_kind"] == "ticket")["n_tasks"].to_list() == [12]


def test_every_bundled_task_passes_with_its_reference_and_fails_empty(ingested, docker_client, grader):
    from envforge.sandbox.images import build_base_image, build_task_image
    from envforge.sources.gitrepo import repository_dir

    data, _ = ingested
    settings = Settings.from_env().with_data_dir(data)
    base = build_base_image(docker_client, settings).tag
    failures = []
    for task in Catalog(settings.catalog_path).load_tasks():
        # as the images stage does: a commit outside the commit store is read from the source's repository
        image = build_task_image(docker_client, task, base, settings, repository_dir=repository_dir).tag
        diff, problems = grader.solution_diff(task, image, "reference")
        reference = grader.grade(task, image, diff, solution="reference")
        empty = grader.grade(task, image, "", solution="empty")
        if problems or not reference.resolved or empty.resolved or empty.reward != 0:
            failures.append((task.id, problems, reference.reasons, empty.reasons))
    assert not failures


def test_dagster_source_partitions_match_the_cli(ingested):
    from assets.defs.resources import default_resources
    from assets.defs.sources.assets import candidate_tasks
    from tests.test_dagster import materialize_sources

    data, doc = ingested
    settings = Settings.from_env().with_data_dir(data)  # same data dir: derivations and images are cached
    instance = dg.DagsterInstance.ephemeral()
    results = materialize_sources(instance, default_resources(settings), settings.bundled_sources(),
                                  kinds=("spec", "runbook", "swebench", "ticket", "review"))
    assert all(r.success for r in results)
    metadata = [e.materialization.metadata for r in results for e in r.get_asset_materialization_events()]
    assert sum(md["valid"].value for md in metadata) == doc["valid"]
    assert sum(md["rejected"].value for md in metadata) == doc["rejected"]
    checks = [e for r in results for e in r.get_asset_check_evaluations()]
    assert checks and all(e.passed for e in checks)
    merged = dg.materialize([candidate_tasks], instance=instance, resources=default_resources(settings))
    md = merged.asset_materializations_for_node("candidate_tasks")[0].metadata
    assert md["tasks"].value == 26 and md["rejects"].value == len(EXPECTED_REJECTS)
