"""Sources are untrusted input: confinement, ingest that never crashes, limits (no Docker here).

The case set in tests/malformed_sources.py (malformed and hostile records of all five kinds)
must come out with zero crashes, zero hangs and zero wrong accepts, every reject naming the
field and saying what is wrong; `bench/malformed_sources.py` prints the same tally as JSON.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from envforge import safefs
from envforge.config import Settings
from envforge.errors import ImageBuildError
from envforge.hashing import tree_digest
from envforge.sources.policy import SourcePolicy
from envforge.sources.specs import load_spec_file
from envforge.stages.configs import IngestConfig
from envforge.stages.ingest import ingest
from tests.conftest import BUNDLED_SPECS, REPO
from tests.malformed_sources import make_socket, run_cases, tally


def test_the_malformed_case_set_is_rejected_with_reasons_and_nothing_crashes(tmp_path):
    outcomes = run_cases(tmp_path)
    bad = [o for o in outcomes if o.status not in ("rejected", "accepted", "skipped")]
    assert not bad, "\n".join(f"{o.status} {o.case}: {o.detail}" for o in bad)
    counts = tally(outcomes)
    assert counts["cases"] >= 90 and set(counts["by_kind"]) == {"spec", "runbook", "swebench", "ticket", "review"}
    assert counts["crashes"] == counts["hangs"] == counts["wrong_accepts"] == 0


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    root = tmp_path / "sources"
    shutil.copytree(BUNDLED_SPECS, root / "specs")
    shutil.copytree(REPO / "task_sources" / "runbooks", root / "runbooks")
    return root


def test_one_bad_source_costs_that_source_not_the_batch(sources, tmp_path, monkeypatch):
    """A runbook whose front matter used to raise TypeError, a spec workspace holding a socket and a
    FIFO, and a notes file without front matter: the other 8 tasks land, each bad one is a reject."""
    monkeypatch.setenv("ENVFORGE_SOURCE_ROOTS", "")
    good = (sources / "runbooks" / "log-rotation.md").read_text()
    (sources / "runbooks" / "bad-metadata.md").write_text(good.replace("id: rb-log-rotation", "id: rb-bad\nmetadata: x"))
    ws = sources / "specs" / "inventory-median-even" / "workspace"
    make_socket(ws / "agent.sock")
    os.mkfifo(ws / "pipe")
    (sources / "runbooks" / "notes.md").write_text("# Notes\n\nnot a runbook\n")
    report = ingest(Settings.from_env().with_data_dir(tmp_path / "data"), IngestConfig(), [sources])
    assert len(report.result.tasks) == 7  # 8 bundled minus the spec with the socket and the FIFO
    reasons = {(Path(p.file).name, p.field): p.reason for p in report.result.rejects}
    assert "dictionary" in reasons[("bad-metadata.md", "front matter.metadata")]
    assert "a socket" in reasons[("task.yaml", "environment.files")] and "a FIFO" in reasons[("task.yaml", "environment.files")]
    assert [Path(p.source).name for p in report.skipped] == ["notes.md"]
    assert "front matter" in report.skipped[0].reason


def test_the_same_id_from_another_source_is_a_reject_naming_both(sources, tmp_path, monkeypatch):
    monkeypatch.setenv("ENVFORGE_SOURCE_ROOTS", "")
    settings = Settings.from_env().with_data_dir(tmp_path / "data")
    first = ingest(settings, IngestConfig(), [sources / "specs" / "inventory-median-even"])
    assert [t.id for t in first.result.tasks] == ["inventory-median-even"]
    other = tmp_path / "team-b" / "median"
    shutil.copytree(sources / "specs" / "inventory-median-even", other)
    (other / "task.yaml").write_text((other / "task.yaml").read_text().replace("do not\n  change the tests.",
                                                                              "keep the tests as they are."))
    second = ingest(settings, IngestConfig(), [other])
    assert second.result.tasks == []
    [problem] = second.result.rejects
    assert problem.field == "id" and "already current from source" in problem.reason
    assert str(sources / "specs" / "inventory-median-even") in problem.reason
    again = ingest(settings, IngestConfig(), [sources / "specs" / "inventory-median-even"])  # its own source may re-ingest it
    assert [t.id for t in again.result.tasks] == ["inventory-median-even"] and not again.result.rejects


def test_the_source_policy_comes_from_its_config_file_and_the_environment(tmp_path):
    config = tmp_path / "sources.yaml"
    config.write_text(f"roots: [{tmp_path / 'shared'}]\nmoving_refs: refuse\nmax_text_chars: 1000\n")
    policy = SourcePolicy.from_env({"ENVFORGE_SOURCE_CONFIG": str(config)})
    assert policy.roots == (tmp_path / "shared",) and policy.moving_refs == "refuse" and policy.max_text_chars == 1000
    over = SourcePolicy.from_env({"ENVFORGE_SOURCE_CONFIG": str(config), "ENVFORGE_SOURCE_ROOTS": "",
                                  "ENVFORGE_MOVING_REFS": "resolve"})
    assert over.roots == () and over.moving_refs == "resolve"
    default = SourcePolicy.from_env({"ENVFORGE_TASK_SOURCES": str(tmp_path / "ts")})
    assert default.roots == (tmp_path / "ts",)
    config.write_text("max_text_chars: lots\n")
    with pytest.raises(ValueError, match="max_text_chars"):
        SourcePolicy.from_env({"ENVFORGE_SOURCE_CONFIG": str(config)})


def test_allowed_roots_and_inside_links_are_honoured(copy_spec, tmp_path, monkeypatch):
    spec_dir = copy_spec("inventory-median-even")
    shared = tmp_path / "shared-workspaces"
    shutil.copytree(spec_dir / "workspace", shared / "inventory")
    os.symlink("stats.py", shared / "inventory" / "inventory" / "stats_link.py")
    (spec_dir / "task.yaml").write_text((spec_dir / "task.yaml").read_text().replace(
        "files: workspace", f"files: {shared / 'inventory'}"))
    monkeypatch.setenv("ENVFORGE_SOURCE_ROOTS", "")
    with pytest.raises(Exception, match="outside the source's folder"):
        load_spec_file(spec_dir / "task.yaml")
    monkeypatch.setenv("ENVFORGE_SOURCE_ROOTS", str(shared))
    task = load_spec_file(spec_dir / "task.yaml")
    dest = tmp_path / "copy"
    safefs.copy_tree(task.workspace_path(), dest)
    assert os.readlink(dest / "inventory" / "stats_link.py") == "stats.py"  # kept as a link, not followed


def test_a_workspace_changed_after_ingest_is_checked_again_when_its_image_is_built(copy_spec, tmp_path):
    from envforge.sandbox.images import _write_workspace

    spec_dir = copy_spec("inventory-median-even")
    task = load_spec_file(spec_dir / "task.yaml")
    os.symlink("/etc/shadow", spec_dir / "workspace" / "shadow")
    with pytest.raises(ImageBuildError, match="absolute path"):
        _write_workspace(task, tmp_path / "ctx", Settings.from_env().with_data_dir(tmp_path / "data"))


def test_hashing_a_folder_never_opens_a_fifo(tmp_path):
    (tmp_path / "a.txt").write_text("a")
    os.mkfifo(tmp_path / "pipe")
    first = tree_digest(tmp_path)  # would block forever if the FIFO were opened
    assert first == tree_digest(tmp_path)


def test_a_spec_repository_at_a_moving_ref_is_pinned_to_its_sha(copy_spec, tmp_path, monkeypatch):
    from tests.test_history_sources import make_calc_repo

    spec_dir = copy_spec("inventory-median-even")
    shas = make_calc_repo(spec_dir / "repo")
    text = (spec_dir / "task.yaml").read_text().replace("files: workspace",
                                                        "repository: {path: repo, commit: \"main~1\"}")
    (spec_dir / "task.yaml").write_text(text.replace("reference_solution:\n  patch: solution.patch",
                                                     "reference_solution:\n  commands: [\"true\"]"))
    task = load_spec_file(spec_dir / "task.yaml")
    assert task.spec.environment.repository.commit == shas["change"]
    assert task.spec.metadata["resolved_refs"] == {"environment.repository.commit": {"ref": "main~1",
                                                                                     "sha": shas["change"]}}
    monkeypatch.setenv("ENVFORGE_MOVING_REFS", "refuse")
    with pytest.raises(Exception, match="moving ref"):
        load_spec_file(spec_dir / "task.yaml")


def test_derived_test_ids_that_could_never_pass_are_left_out(tmp_path):
    from envforge.sources.derive import Derivation, Run, task_from_derivation
    from envforge.sources.gitrepo import SplitChange
    from envforge.sources.tickets import TicketSourceConfig
    from envforge.sources.candidate import Candidate

    change = SplitChange("--- a/x.py\n+++ b/x.py\n", "--- a/tests/t.py\n+++ b/tests/t.py\n", ["x.py"], ["tests/t.py"])
    cand = Candidate(id="c-1", kind="ticket", origin="t.jsonl:1", field="fix_commit", instruction="Fix the thing now.",
                     git_dir=tmp_path, workspace_commit="a" * 40, change=change,
                     config=TicketSourceConfig(repository=".", exports=[{"file": "t.jsonl"}]), base_dir=tmp_path)
    before = Run({"tests/t.py::test_a": "failed", "tests/t.py::test_b[x\ty]": "failed", "tests/t.py::test_c[x y]": "failed"})
    after = Run({"tests/t.py::test_a": "passed", "tests/t.py::test_b[x\ty]": "passed", "tests/t.py::test_c[x y]": "passed"})
    graded = {"after": Run({"tests/t.py::test_a": "passed", "tests/t.py::test_c[x y]": "passed"}),
              "before": Run({"tests/t.py::test_a": "failed", "tests/t.py::test_c[x y]": "failed"})}
    task = task_from_derivation(cand, Derivation([before], [after, after], [graded]))
    # A space inside a parametrize id is an ordinary id; a tab could never be matched in a report.
    assert task.spec.verification.tests.fail_to_pass == ["tests/t.py::test_a", "tests/t.py::test_c[x y]"]
    assert task.spec.metadata["unselectable_tests"] == ["tests/t.py::test_b[x\ty]"]


def test_the_reversed_run_is_left_out_only_when_the_first_runs_already_reject(tmp_path, monkeypatch):
    """No test passing after the change that did not pass before: the reversed run (which only takes ids
    away) cannot make a FAIL_TO_PASS test, so the candidate is rejected after two suite runs, not three."""
    from envforge.errors import SpecError
    from envforge.sources import derive
    from envforge.sources.candidate import Candidate
    from envforge.sources.gitrepo import SplitChange
    from envforge.sources.tickets import TicketSourceConfig

    change = SplitChange("--- a/x.py\n+++ b/x.py\n", "--- a/tests/t.py\n+++ b/tests/t.py\n", ["x.py"], ["tests/t.py"])
    cand = Candidate(id="c-1", kind="ticket", origin="t.jsonl:1", field="fix_commit", instruction="Fix the thing now.",
                     git_dir=tmp_path, workspace_commit="a" * 40, change=change,
                     config=TicketSourceConfig(repository=".", exports=[{"file": "t.jsonl"}]), base_dir=tmp_path)
    outcomes = {"before": {"tests/t.py::test_a": "passed", "tests/t.py::test_b": "failed"}}
    runs = []

    def fake_run(pool, task, image, patches, run=derive.WHOLE_SUITE):
        state = "before" if len(patches) == 1 else "after"
        runs.append((state, run.order))
        return derive.Run(dict(outcomes[state]))

    monkeypatch.setattr(derive, "_run", fake_run)
    outcomes["after"] = {"tests/t.py::test_a": "passed", "tests/t.py::test_b": "failed"}
    decided = derive.run_derivation(None, cand, "img")
    assert sorted(runs) == [("after", "default"), ("before", "default")] and len(decided.after) == 1
    with pytest.raises(SpecError, match="no failing-then-passing test: 2 tests ran after the change, 1 already passed"):
        derive.task_from_derivation(cand, decided)
    runs.clear()
    derive.run_derivation(None, cand, "img", always_reverse=True)  # the derivation as it was
    assert sorted(runs[:2]) == [("after", "default"), ("before", "default")] and runs[2] == ("after", "reverse")
    runs.clear()
    outcomes["after"] = {"tests/t.py::test_a": "passed", "tests/t.py::test_b": "passed"}
    monkeypatch.setattr(derive, "_grade", lambda *a, **k: {"after": derive.Run(dict(outcomes["after"])),
                                                           "before": derive.Run(dict(outcomes["before"]))})
    kept = derive.run_derivation(None, cand, "img")  # a FAIL_TO_PASS candidate: the reversed run decides
    assert runs[-1] == ("after", "reverse") and len(kept.after) == 2
    assert derive.task_from_derivation(cand, kept).spec.verification.tests.fail_to_pass == ["tests/t.py::test_b"]



def test_the_first_check_runs_alongside_the_reversed_run_and_counts_only_for_the_same_files(tmp_path, monkeypatch):
    """The reversed after-run can only take ids away, so the first grader-way check grades the ids of the file-order
    runs at the same time (both block on one barrier: run one after the other, they would time out). It confirms
    the lists when the final ids lie in the files it graded; when the reversed run drops a whole file's ids, a
    check of the final ids runs after it."""
    import threading

    from envforge.sources import derive

    files = ["tests/t.py", "tests/u.py"]
    ids = {"tests/t.py::test_a": "passed", "tests/u.py::test_b": "passed"}
    reversed_after = dict(ids)
    at_once = threading.Barrier(2, timeout=10)
    checked: list[list[str]] = []

    passing: dict[str, str] = {}  # PASS_TO_PASS ids: passing before and after

    def fake_run(pool, task, image, patches, run=derive.WHOLE_SUITE):
        if len(patches) == 1:
            return derive.Run({t: "failed" for t in ids} | passing)
        if run.order == "reverse":
            at_once.wait()
            return derive.Run(reversed_after | passing)
        return derive.Run(ids | passing)

    def fake_grade(pool, candidate, image, f2p, p2p, only=None):
        if not checked:
            at_once.wait()
        checked.append(sorted(f2p))
        return {"after": derive.Run({t: "passed" for t in f2p}), "before": derive.Run({t: "failed" for t in f2p})}

    monkeypatch.setattr(derive, "_run", fake_run)
    monkeypatch.setattr(derive, "_grade", fake_grade)
    cand = _derivation_candidate(tmp_path, files)
    same = derive.run_derivation(None, cand, "img")
    assert checked == [sorted(ids)] and len(same.checks) == 1
    assert derive.task_from_derivation(cand, same).spec.verification.tests.fail_to_pass == sorted(ids)

    checked.clear()
    at_once.reset()
    reversed_after.pop("tests/u.py::test_b")  # missing in the reversed run: u.py holds no final id any more
    fewer = derive.run_derivation(None, cand, "img")
    assert checked == [sorted(ids), ["tests/t.py::test_a"]] and len(fewer.checks) == 1
    assert derive.task_from_derivation(cand, fewer).spec.verification.tests.fail_to_pass == ["tests/t.py::test_a"]

    checked.clear()
    at_once.reset()
    reversed_after.pop("tests/t.py::test_a")  # no FAIL_TO_PASS left: the check made alongside is not kept,
    passing.update({"tests/t.py::test_p": "passed", "tests/u.py::test_q": "passed"})  # though its files are the same
    none_left = derive.run_derivation(None, cand, "img")
    assert checked == [sorted(ids)] and none_left.checks == []


def _derivation_candidate(tmp_path, test_files, pass_to_pass="test-files"):
    from envforge.sources.candidate import Candidate
    from envforge.sources.gitrepo import SplitChange
    from envforge.sources.tickets import TicketSourceConfig

    change = SplitChange("--- a/x.py\n+++ b/x.py\n", "".join(f"--- a/{f}\n+++ b/{f}\n" for f in test_files),
                         ["x.py"], list(test_files))
    config = TicketSourceConfig(repository=".", exports=[{"file": "t.jsonl"}], tests={"pass_to_pass": pass_to_pass})
    return Candidate(id="c-1", kind="ticket", origin="t.jsonl:1", field="fix_commit", instruction="Fix the thing now.",
                     git_dir=tmp_path, workspace_commit="a" * 40, change=change, config=config, base_dir=tmp_path)


def test_the_derivation_runs_the_test_files_the_change_touches(tmp_path, monkeypatch):
    """By default the runs cover the change's test files (what a task built from it grades); the whole suite
    when those files hold no test (only a conftest or data changed), or with `tests.pass_to_pass: suite`. The
    scope is part of the cache key and of the task's metadata."""
    from envforge.sources import derive

    runs, collected = [], {}

    def fake_run(pool, task, image, patches, run=derive.WHOLE_SUITE):
        state = "before" if len(patches) == 1 else "after"
        runs.append((state, run.scope, run.order, run.files))
        statuses = {"tests/t.py::test_a": "passed", "tests/t.py::test_b": "passed" if state == "after" else "failed"}
        return derive.Run(statuses if collected.get(run.scope, True) else {})

    monkeypatch.setattr(derive, "_run", fake_run)
    monkeypatch.setattr(derive, "_grade", lambda *a, **k: {
        "after": derive.Run({"tests/t.py::test_a": "passed", "tests/t.py::test_b": "passed"}),
        "before": derive.Run({"tests/t.py::test_a": "passed", "tests/t.py::test_b": "failed"})})
    scoped = _derivation_candidate(tmp_path, ["tests/t.py", "tests/data/case.json", "tests/conftest.py"])
    derivation = derive.run_derivation(None, scoped, "img")
    files = ("tests/conftest.py", "tests/t.py")
    # the first before and after runs go at once; the reversed one follows
    assert sorted(runs[:2]) == [("after", "targeted", "default", files), ("before", "targeted", "default", files)]
    assert runs[2:] == [("after", "targeted", "reverse", files)]
    task = derive.task_from_derivation(scoped, derivation)
    assert task.spec.metadata["derivation"]["files"] == list(files)
    assert "pass_to_pass_elsewhere" not in task.spec.metadata
    assert derive.Derivation.from_json(derivation.as_json()) == derivation

    runs.clear()
    collected["targeted"] = False  # the files the change touches collect nothing: the whole suite instead
    fallback = derive.run_derivation(None, scoped, "img")
    assert sorted(r[:3] for r in runs[:4]) == [("after", "suite", "default"), ("after", "targeted", "default"),
                                               ("before", "suite", "default"), ("before", "targeted", "default")]
    assert runs[4][:3] == ("after", "suite", "reverse")
    assert fallback.files is None and "pass_to_pass_elsewhere" in derive.task_from_derivation(scoped, fallback).spec.metadata

    runs.clear()
    whole = _derivation_candidate(tmp_path, ["tests/t.py"], pass_to_pass="suite")
    derive.run_derivation(None, whole, "img")
    assert {r[1] for r in runs} == {"suite"}
    assert derive.cache_key(whole, "img") != derive.cache_key(_derivation_candidate(tmp_path, ["tests/t.py"]), "img")


def test_tasks_stored_under_older_rules_still_load_from_the_catalog():
    """Test ids and limits are checked at ingest; a catalog written before a rule got stricter stays readable."""
    from envforge.task import Task

    task = load_spec_file(BUNDLED_SPECS / "inventory-median-even" / "task.yaml")
    old = task.model_dump_json().replace("tests/test_stats.py::test_mean", "tests/test_stats.py::test_mean ") \
        .replace('"memory_mb":512', '"memory_mb":200')
    with pytest.raises(Exception, match="ends with a space"):
        Task.model_validate_json(old)
    stored = Task.from_stored(old)
    assert "tests/test_stats.py::test_mean " in stored.spec.verification.tests.pass_to_pass
    assert stored.spec.environment.limits.memory_mb == 200


def test_a_jsonl_line_of_control_characters_is_a_reject_not_a_gap(tmp_path):
    """str.strip() takes \\x1c-\\x1f as whitespace; only JSON's whitespace makes a line blank."""
    from envforge.sources.records import iter_records

    path = tmp_path / "records.jsonl"
    path.write_bytes(b'{"id": 1}\n\x1c\n \t\r\n{"id": 2}\n')
    got = list(iter_records(path))
    assert [r for _, r in got if isinstance(r, dict)] == [{"id": 1}, {"id": 2}]
    [(where, problem)] = [(w, r) for w, r in got if not isinstance(r, dict)]
    assert where.endswith("records.jsonl:2") and "not a JSON record" in problem.reason


def test_plugins_that_shuffle_the_tests_are_not_loaded_from_an_env_layers_record():
    """pytest-randomly (filelock's test dependencies bring it) puts the tests in a new random order on every
    run; derivation's forward/reversed runs and the gate's repeated ones rest on a fixed order. The env
    layer's record still lists it (images.env_plugins); a source that names it itself still gets it."""
    from envforge.sources.candidate import with_env_plugins

    recorded = ["pytest_asyncio.plugin", "pytest_randomly", "random_order.plugin", "pytest_mock"]
    assert with_env_plugins([], recorded) == ["pytest_asyncio.plugin", "pytest_mock"]
    assert with_env_plugins(["pytest_randomly"], recorded) == ["pytest_randomly", "pytest_asyncio.plugin",
                                                               "pytest_mock"]
