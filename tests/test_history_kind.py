"""The `history` source kind: a repository's plain commits as candidates (filters, ranges, linked
issues, bad config), and one ingested for real with its tests derived in a sandbox."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from envforge.sources import scan_sources
from envforge.sources.history import load_history_source
from tests.test_history_sources import commit, git, make_calc_repo

pytestmark = pytest.mark.usefixtures("allow_tmp_sources")


@pytest.fixture
def calc(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """make_calc_repo's history, then a bot's dependency bump and a commit linking issue #42."""
    repo = tmp_path / "calc"
    shas = make_calc_repo(repo)
    git(repo, "config", "user.name", "x")
    shas["bump"] = commit(repo, "Bump pytest from 7 to 8", {"requirements-dev.txt": "pytest==8\n",
                                                           "tests/test_calc.py": (repo / "tests/test_calc.py")
                                                           .read_text() + "\n"}, 6)
    shas["linked"] = commit(repo, "add neg\n\nFixes #42", {
        "calc.py": (repo / "calc.py").read_text() + "\n\ndef neg(a):\n    return -a\n",
        "tests/test_neg.py": "from calc import neg\n\n\ndef test_neg():\n    assert neg(3) == -3\n"}, 7)
    return repo, shas


def write_history(root: Path, repo: Path, body: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "issues.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["number", "title", "body"])
        w.writerow(["42", "calc cannot negate a number", "Callers write mul(x, -1) to negate, which is unclear; "
                                                         "calc should offer a neg function returning -x."])
    (root / "history.yaml").write_text(f"repository: {repo}\nproject: calc\n{body}"
                                       "issues:\n  - file: issues.csv\n    preset: github\n")
    return root / "history.yaml"


def test_commits_that_change_source_and_tests_become_candidates_the_rest_are_skipped_with_why(calc, tmp_path):
    repo, shas = calc
    result = load_history_source(write_history(tmp_path / "h", repo))
    ids = [c.id for c in result.candidates]
    assert ids == [f"calc-{shas[k][:12]}" for k in ("linked", "follow_up", "characterization", "fix")]
    by_sha = {c.metadata["fix_commit"]: c for c in result.candidates}
    linked = by_sha[shas["linked"]]
    assert linked.kind == "history" and linked.metadata["issue"] == "42"
    assert linked.instruction.startswith("calc cannot negate a number")  # the words, not the commit's
    assert linked.workspace_commit == shas["bump"] and linked.change.test_files == ["tests/test_neg.py"]
    assert by_sha[shas["fix"]].instruction == "Fix add (CALC-1) SECRET-FIX-MARKER"  # no issue: the message
    skipped = {p.source.rsplit(":", 1)[1]: p.reason for p in result.skipped}
    assert skipped[shas["bump"][:12]].startswith("message matches skip_messages")
    assert skipped[shas["docs"][:12]] == "changes no test files (nothing to verify it with)"
    assert skipped[shas["change"][:12]].startswith("changes no test files")
    assert skipped[shas["initial"][:12]].startswith("root commit")
    assert result.rejects == []


def test_range_and_filters(calc, tmp_path):
    repo, shas = calc
    last = load_history_source(write_history(tmp_path / "a", repo, "range: {last: 2}\n"))
    assert [c.metadata["fix_commit"] for c in last.candidates] == [shas["linked"], shas["follow_up"]]
    since = load_history_source(write_history(tmp_path / "b", repo, f"range: {{since: {shas['change']}}}\n"))
    assert {c.metadata["fix_commit"] for c in since.candidates} == {shas["linked"], shas["follow_up"]}
    dated = load_history_source(write_history(tmp_path / "c", repo, "range: {since: '2024-01-06'}\n"))
    assert {c.metadata["fix_commit"] for c in dated.candidates} == {shas["linked"], shas["follow_up"]}
    bump_ok = load_history_source(write_history(tmp_path / "d", repo, "filters: {skip_messages: [], skip_subjects: {}}\n"))
    reasons = {p.source.rsplit(":", 1)[1]: p.reason for p in bump_ok.skipped}
    assert reasons[shas["bump"][:12]].startswith("dependency bump")
    bots = load_history_source(write_history(tmp_path / "e", repo, "filters: {skip_authors: ['dev*']}\n"))
    assert bots.candidates == [] and all("skip_authors" in p.reason or "root" in p.reason for p in bots.skipped)


def test_the_default_author_filter_leaves_out_bots_only():
    """`*[bot]*` means a name holding `[bot]`, not any name with a b, an o or a t (an fnmatch
    character class): with that reading the default filter skipped nearly every real commit."""
    from envforge.sources.history import Commit, HistoryFilters, skip_reason

    filters = HistoryFilters.model_validate({})
    human = Commit("a" * 40, ("b" * 40,), "Thomas Kemmer", "tkemmer@computer.org", "2026-01-01T00:00:00Z", "Fix x")
    bot = Commit("a" * 40, ("b" * 40,), "dependabot[bot]", "4969+dependabot[bot]@users.noreply.github.com",
                 "2026-01-01T00:00:00Z", "Fix x")
    ci = Commit("a" * 40, ("b" * 40,), "pre-commit-ci[bot]", "66853113+pre-commit-ci[bot]@users.noreply.github.com",
                "2026-01-01T00:00:00Z", "Fix x")
    assert skip_reason(human, filters) is None
    assert "skip_authors '*[bot]*'" in (skip_reason(bot, filters) or "")
    assert "skip_authors" in (skip_reason(ci, filters) or "")
    question = HistoryFilters.model_validate({"skip_authors": ["t?omas*"]})
    assert "skip_authors" in (skip_reason(human, question) or "")


def test_bad_config_is_a_reject_naming_the_file_and_field(calc, tmp_path):
    repo, _ = calc
    for body, field, words in (("range: {since: v9.9}\n", "range.since", "neither a date"),
                               ("range: {last: 0}\n", "range.last", "greater than or equal"),
                               ("filters: {skip_messages: ['(']}\n", "filters.skip_messages", "not a valid regular expression"),
                               ("range: {branch: nope}\n", "range.branch", "does not name a commit")):
        cfg = write_history(tmp_path / field.replace(".", "-"), repo, body)
        result = load_history_source(cfg)
        assert result.candidates == [] and len(result.rejects) == 1, (body, result.rejects)
        [problem] = result.rejects
        assert problem.source == str(cfg) and problem.field == field and words in problem.reason, problem


def test_a_message_too_short_to_state_a_task_keeps_its_candidate_for_the_repair(calc, tmp_path):
    """A subject under 10 characters does not lose the candidate on its own: the statement check describes
    the task by the failure its tests showed, after cleaning off envforge's `Commit X:` prefix."""
    from envforge.quality.statements import StatementContext, repair_statement

    repo, shas = calc
    sha = commit(repo, "sub", {"calc.py": (repo / "calc.py").read_text() + "\n\ndef sub(a, b):\n    return a - b\n",
                               "tests/test_sub.py": "from calc import sub\n\n\ndef test_sub():\n"
                                                    "    assert sub(3, 1) == 2\n"}, 8)
    result = load_history_source(write_history(tmp_path / "h", repo))
    assert result.rejects == []
    [short] = [c for c in result.candidates if c.metadata["fix_commit"] == sha]
    assert short.instruction == f"Commit {sha[:12]}: sub"
    failure = (("tests/test_sub.py::test_sub", "ImportError: cannot import name 'sub' from 'calc'"),)
    context = StatementContext(kind="history", failure_messages=failure)
    check = repair_statement(short.instruction, context)
    assert check.verdict == "repaired" and check.added_failures == 1, check
    assert check.statement.startswith("sub.") and "Commit" not in check.statement
    assert "cannot import name 'sub'" in check.statement
    # with the commit's own change and tests, `sub` is the interface: the repair says it is missing, and no leak
    task = short.provisional_task()
    context = StatementContext.of_task(task.model_copy(update={"spec": task.spec.model_copy(
        update={"metadata": {"failure_messages": dict(failure)}})}))
    check = repair_statement(short.instruction, context)
    assert check.verdict == "repaired" and "`calc.sub` does not exist." in check.statement, check


def test_history_sources_are_discovered_as_their_own_kind(calc, tmp_path):
    repo, _ = calc
    cfg = write_history(tmp_path / "h", repo)
    assert [(r.kind, r.path) for r in scan_sources([tmp_path / "h"]).refs] == [("history", cfg)]


def test_the_bundled_history_examples_load_and_scan():
    """task_sources/examples/history: three real projects' recent history, nothing declared but the
    bundle. Each loads with its candidates (newest first, with the upstream commit's message as the
    statement) and no rejects, and `sources scan` lists every commit with what it would become."""
    import json
    import os
    import subprocess
    import sys

    examples = Path(__file__).resolve().parents[1] / "task_sources" / "examples" / "history"
    refs = scan_sources([examples]).refs
    assert sorted((r.kind, r.path.parent.name) for r in refs) == [
        ("history", "sqlparse"), ("history", "tenacity"), ("history", "tomli")]
    counts = {"tenacity": (5, 8), "sqlparse": (7, 23), "tomli": (4, 17)}
    for name, (candidates, commits) in counts.items():
        result = load_history_source(examples / name / "history.yaml")
        assert result.rejects == [] and len(result.candidates) == candidates, (name, result.rejects)
        assert len(result.candidates) + len(result.skipped) == commits
        assert all(c.id.startswith(f"{name}-") and c.kind == "history" for c in result.candidates)
        dates = [c.metadata["committed_at"] for c in result.candidates]
        assert dates == sorted(dates, reverse=True)
    envforge = os.path.join(os.path.dirname(sys.executable), "envforge")
    proc = subprocess.run([envforge, "sources", "scan", str(examples), "--json"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["counts"] == {"candidate": 16, "skipped": 32}


@pytest.mark.docker
def test_a_history_source_is_ingested_with_derived_tests_and_checked_statements(calc, tmp_path, settings,
                                                                                docker_client):
    from envforge.catalog import Catalog
    from envforge.stages.configs import IngestConfig
    from envforge.stages.ingest import ingest

    repo, shas = calc
    cfg = write_history(tmp_path / "h", repo, "range: {last: 2}\n")
    report = ingest(settings, IngestConfig(), [cfg], client=docker_client)
    [source] = report.sources
    assert source.kind == "history"
    tasks = {t.spec.metadata["fix_commit"]: t for t in source.result.tasks}
    linked = tasks[shas["linked"]]
    assert linked.spec.verification.tests.fail_to_pass == ["tests/test_neg.py::test_neg"]
    assert linked.spec.instruction.startswith("calc cannot negate a number")
    follow_up = tasks[shas["follow_up"]]
    assert follow_up.spec.verification.tests.fail_to_pass == ["tests/test_div.py::test_div_zero"]
    # a bare commit subject is described by the failure the test showed before the fix
    assert follow_up.spec.metadata["statement"]["verdict"] == "repaired"
    assert "Observed behaviour" in follow_up.spec.instruction and "test_div_zero" not in follow_up.spec.instruction
    loads = Catalog(settings.catalog_path).source_loads()
    assert loads["source_kind"].to_list() == ["history"] and loads["n_tasks"].to_list() == [2]


def test_sources_scan_is_a_dry_run_listing_what_each_record_becomes(calc, tmp_path):
    import json
    import os
    import subprocess
    import sys

    repo, shas = calc
    cfg = write_history(tmp_path / "h", repo)
    envforge = os.path.join(os.path.dirname(sys.executable), "envforge")
    proc = subprocess.run([envforge, "sources", "scan", str(cfg), "--json", "--data-dir", str(tmp_path / "data")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["counts"] == {"candidate": 4, "skipped": 4}
    rows = {r["record"].rsplit(":", 1)[1]: r for r in doc["records"]}
    assert rows[shas["fix"][:12]]["becomes"] == "candidate"
    assert rows[shas["fix"][:12]]["statement"] == "flagged"  # a bare subject, before derivation shows the failure
    assert rows[shas["docs"][:12]]["reason"].startswith("commit: changes no test files")
    assert not (tmp_path / "data" / "catalog.duckdb").exists()  # nothing written


def test_sources_scan_prints_bracketed_names_and_patterns_as_they_are(calc, tmp_path):
    """The table quotes author names and filter patterns (`dependabot[bot]`, `*[bot]*`) that rich
    would otherwise take for markup and drop."""
    import os
    import subprocess
    import sys

    repo, _ = calc
    commit(repo, "Update calc for the new API", {"calc.py": (repo / "calc.py").read_text() + "\n# api\n",
                                                 "tests/test_api.py": "def test_api():\n    pass\n"}, 8)
    git(repo, "commit", "--amend", "--no-edit", "--author=dependabot[bot] <1+dependabot[bot]@users.noreply.github.com>")
    cfg = write_history(tmp_path / "h", repo)
    envforge = os.path.join(os.path.dirname(sys.executable), "envforge")
    proc = subprocess.run([envforge, "sources", "scan", str(cfg), "--data-dir", str(tmp_path / "data")],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "400"})
    assert proc.returncode == 0, proc.stderr
    assert "author dependabot[bot] <" in proc.stdout and "skip_authors '*[bot]*'" in proc.stdout, proc.stdout


def test_the_funnel_tells_envforges_losses_from_the_records():
    from envforge.errors import Problem
    from envforge.sources.funnel import Funnel, classify

    rejects = [Problem("t.csv:row 1", "environment", "env layer build failed: setuptools too old"),
               Problem("t.csv:row 2", "fix_commit", "the change has no failing-then-passing test: 3 tests ran"),
               Problem("t.csv:row 3", "fix_commit", "the change has no failing-then-passing test: 2 tests ran; "
                                                    "tests could not be collected after the change: x: Unknown "
                                                    "pytest.mark.asyncio"),
               Problem("t.csv:row 4", "instruction", "statement flagged: underspecified.bare_title: 'x'"),
               Problem("t.csv:row 5", "title", "required field is missing")]
    assert [(classify(p).stage, classify(p).owner) for p in rejects] == [
        ("environment", "envforge"), ("derive", "record"), ("derive", "envforge"), ("statement", "record"),
        ("parse", "record")]
    funnel = Funnel.of(tasks=6, rejects=rejects, skipped=3)
    assert (funnel.candidates, funnel.environment_built, funnel.derived, funnel.accepted) == (10, 9, 7, 6)
    assert funnel.envforge_losses == 2 and funnel.lost["parse/record"] == 1


@pytest.mark.docker
def test_a_second_ingest_derives_only_the_commits_new_since_the_cursor(calc, tmp_path, settings, docker_client,
                                                                       monkeypatch):
    from envforge.catalog import Catalog
    from envforge.sources import derive
    from envforge.stages.configs import IngestConfig
    from envforge.stages.ingest import ingest

    repo, shas = calc
    cfg = write_history(tmp_path / "h", repo)
    first = ingest(settings, IngestConfig(), [cfg], client=docker_client)
    assert len(first.result.tasks) == 3 and len(first.result.rejects) == 1  # characterization: no failing test
    loads = Catalog(settings.catalog_path).source_loads()
    assert loads["cursor"].to_list() == [shas["linked"]]

    shas["new"] = commit(repo, "add sub(a, b)", {
        "calc.py": (repo / "calc.py").read_text() + "\n\ndef sub(a, b):\n    return a - b\n",
        "tests/test_sub.py": "from calc import sub\n\n\ndef test_sub():\n    assert sub(3, 1) == 2\n"}, 8)
    derived: list[str] = []
    real = derive.derive_tasks

    def counting(settings, candidates, **kwargs):
        derived.extend(c.metadata["fix_commit"] for c in candidates)
        return real(settings, candidates, **kwargs)

    monkeypatch.setattr(derive, "derive_tasks", counting)
    second = ingest(settings, IngestConfig(), [cfg], client=docker_client)
    assert derived == [shas["new"]]  # only the commit after the cursor ran in a sandbox
    assert len(second.result.tasks) == 4 and len(second.result.rejects) == 1  # the old outcomes carried over
    assert second.summary.added == 1 and second.summary.unchanged == 3
    assert Catalog(settings.catalog_path).source_loads()["cursor"].to_list() == [shas["new"]]

    derived.clear()
    full = ingest(settings, IngestConfig(incremental=False), [cfg], client=docker_client)
    assert sorted(derived) == sorted(shas[k] for k in ("new", "linked", "follow_up", "characterization", "fix"))
    assert [t.content_hash for t in sorted(full.result.tasks, key=lambda t: t.id)] == \
        [t.content_hash for t in sorted(second.result.tasks, key=lambda t: t.id)]

    def hashes(result):
        return [t.content_hash for t in sorted(result.result.tasks, key=lambda t: t.id)]

    # A verdict belongs to its policy: a load under another policy judges the carried tasks again from
    # their original statements (no sandbox), exactly as a full load under that policy would.
    derived.clear()
    off = ingest(settings, IngestConfig(statements="off"), [cfg], client=docker_client)
    assert derived == [] and len(off.result.tasks) == 4
    assert all("statement" not in t.spec.metadata for t in off.result.tasks)
    assert Catalog(settings.catalog_path).latest_load(loads["source_key"][0]).statements == "off"
    back = ingest(settings, IngestConfig(statements="flag"), [cfg], client=docker_client)
    assert derived == [] and hashes(back) == hashes(full)
