"""Tickets and reviews in real sandboxes: FAIL_TO_PASS / PASS_TO_PASS derived by running the
suite before and after the change, history scrubbed, and per-source loads in the catalog."""

from __future__ import annotations

import json

import pytest

from envforge.stages.configs import IngestConfig
from envforge.stages.ingest import ingest
from envforge.catalog import Catalog
from envforge.sandbox.images import build_task_image
from envforge.sources import derive
from envforge.sources.derive import derive_tasks
from envforge.sources.gitrepo import repository_dir
from envforge.sources.reviews import load_review_source
from envforge.sources.tickets import load_ticket_source
from tests.test_history_sources import make_calc_repo, write_review_source, write_ticket_source

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("allow_tmp_sources")]  # repositories beside the sources


@pytest.fixture
def calc(tmp_path):
    repo = tmp_path / "calc"
    return repo, make_calc_repo(repo)


def test_tests_are_derived_by_running_them_and_graded_for_real(calc, tmp_path, settings, docker_client, grader):
    repo, shas = calc
    candidates = load_ticket_source(write_ticket_source(tmp_path / "t", repo, shas)).candidates
    candidates += load_review_source(write_review_source(tmp_path / "r", repo, shas)).candidates
    result = derive_tasks(settings, candidates, client=docker_client)
    tasks = {t.id: t for t in result.tasks}
    assert sorted(tasks) == ["calc-calc-1", "calc-review-pr-3-c1"]
    ticket = tasks["calc-calc-1"].spec.verification.tests
    assert ticket.fail_to_pass == ["tests/test_calc.py::test_add"]
    assert ticket.pass_to_pass == ["tests/test_calc.py::test_mul"]
    review = tasks["calc-review-pr-3-c1"].spec.verification.tests
    assert review.fail_to_pass == ["tests/test_div.py::test_div_zero"]
    # PASS_TO_PASS lives in the files the change touches (SWE-bench's scope), and the runs cover only
    # those files: test_calc.py's passing tests are never run, and grading never runs that file.
    assert review.pass_to_pass == []
    assert tasks["calc-review-pr-3-c1"].spec.metadata["derivation"]["files"] == ["tests/test_div.py"]
    assert "pass_to_pass_elsewhere" not in tasks["calc-review-pr-3-c1"].spec.metadata
    [reject] = result.rejects
    assert reject.source.endswith("gh.csv:row 2") and reject.field == "closed_by_commit"
    assert reject.reason.startswith("the change has no failing-then-passing test: 3 tests ran after the change, "
                                    "3 already passed before")
    from envforge.sandbox.images import build_base_image
    base = build_base_image(docker_client, settings).tag
    for task in tasks.values():
        image = build_task_image(docker_client, task, base, settings).tag
        assert grader.grade(task, image, task.reference_patch).resolved, task.id
        empty = grader.grade(task, image, "")
        assert not empty.resolved and empty.reward == 0, task.id

    # Cached: the same candidates again need no sandbox at all.
    def no_sandbox(*args, **kwargs):
        raise AssertionError("derivation should come from the cache")
    original = derive.run_derivation
    derive.run_derivation = no_sandbox
    try:
        again = derive_tasks(settings, candidates, client=docker_client)
    finally:
        derive.run_derivation = original
    assert [t.content_hash for t in again.tasks] == [t.content_hash for t in result.tasks]


def test_the_fix_is_unreachable_from_the_task_workspace(calc, tmp_path, settings, docker_client, base_image):
    from envforge.sandbox.container import Sandbox, SandboxOptions

    repo, shas = calc
    [cand] = [c for c in load_ticket_source(write_ticket_source(tmp_path / "t", repo, shas)).candidates
              if c.id == "calc-calc-1"]
    image = build_task_image(docker_client, cand.provisional_task(), base_image, settings,
                             repository_dir=repository_dir).tag
    with Sandbox.start(docker_client, image, SandboxOptions()) as sb:
        probes = {
            "commits": "git log --all --reflog --format=%H | sort -u | wc -l",
            "fix_object": f"git cat-file -t {shas['fix']} 2>&1 || true",
            "refs": "git for-each-ref --format='%(refname)' | wc -l",
            "stash_tags_remotes": "git stash list | wc -l; git tag | wc -l; git remote | wc -l",
            "unreachable": "git fsck --unreachable --no-reflogs --no-progress 2>&1 | grep -c unreachable || true",
            "marker": "grep -rl SECRET-FIX-MARKER .git | wc -l; git log --all -p | grep -c 'a + b' || true",
            "packs": "ls .git/objects/pack | wc -l",
        }
        out = {k: sb.exec(cmd).text().split() for k, cmd in probes.items()}
    assert out["commits"] == ["1"]
    assert "fatal" in " ".join(out["fix_object"]) or "Not a valid object" in " ".join(out["fix_object"]) \
        or out["fix_object"][0] != "commit"
    assert out["refs"] == ["1"]
    assert out["stash_tags_remotes"] == ["0", "0", "0"]
    assert out["unreachable"] == ["0"]
    assert out["marker"] == ["0", "0"]


def test_ingest_stores_each_source_as_its_latest_load(calc, tmp_path, settings, docker_client):
    repo, shas = calc
    cfg = write_ticket_source(tmp_path / "t", repo, shas)
    report = ingest(settings, IngestConfig(), [cfg], client=docker_client)
    [source] = report.sources
    assert source.kind == "ticket" and [t.id for t in source.result.tasks] == ["calc-calc-1"]
    assert len(source.result.rejects) == 5  # 4 parse-time + 1 derived
    catalog = Catalog(settings.catalog_path)
    assert catalog.tasks()["task_id"].to_list() == ["calc-calc-1"]
    assert catalog.current_rejects().height == 5
    loads = catalog.source_loads()
    assert loads["n_tasks"].to_list() == [1] and loads["n_rejects"].to_list() == [5]
    # The ticket leaves the export: its task is no longer current, and old rejects are history.
    jira = tmp_path / "t" / "jira.jsonl"
    jira.write_text("\n".join(line for line in jira.read_text().splitlines() if "CALC-1" not in line) + "\n")
    ingest(settings, IngestConfig(), [cfg], client=docker_client)
    assert catalog.tasks().height == 0
    assert catalog.current_rejects().height == 5 and catalog.rejects().height == 10
    assert json.loads(catalog.query("SELECT count(*) AS n FROM source_loads").write_json())[0]["n"] == 2


def test_a_derivation_that_timed_out_is_used_but_not_cached(calc, tmp_path, settings, docker_client, monkeypatch):
    """A test timeout may be the machine's load, not the change: the record is rejected this time
    (no FAIL_TO_PASS came out) and derived again on the next ingest instead of being rejected for good."""
    repo, shas = calc
    candidates = load_ticket_source(write_ticket_source(tmp_path / "t", repo, shas)).candidates[:1]
    calls = []

    def timed_out(pool, candidate, image):
        calls.append(candidate.id)
        slow = derive.Run({"tests/test_calc.py::test_add": "failed"}, ["timeout"])
        return derive.Derivation([slow], [slow, slow])

    monkeypatch.setattr(derive, "run_derivation", timed_out)
    cache = settings.data_dir / "derived"
    cached_before = set(cache.glob("*.json"))
    for _ in range(2):
        result = derive_tasks(settings, candidates, client=docker_client)
        assert not result.tasks and len(result.rejects) == 1
    assert len(calls) == 2
    assert set(cache.glob("*.json")) == cached_before
    unit = derive.Derivation([derive.Run({"a": "passed"})], [derive.Run({"a": "passed"}, ["test_failed:a"])])
    assert not unit.timed_out()


def test_a_leaking_ticket_is_repaired_at_ingest_with_the_failure_the_tests_showed(calc, tmp_path, settings,
                                                                                 docker_client):
    """The derivation records what the FAIL_TO_PASS test printed before the fix; ingest's statement
    check drops the sentences that hand over the hidden test and describes that failure instead."""
    repo, shas = calc
    root = tmp_path / "leaky"
    root.mkdir()
    (root / "jira.jsonl").write_text(json.dumps({"key": "CALC-9", "fields": {
        "summary": "add", "description": "Adds test_add.\n\nCo-authored-by: Dev <dev@example.com>",
        "customfield_1": shas["fix"]}}) + "\n")
    cfg = root / "tickets.yaml"
    cfg.write_text(f"repository: {repo}\nproject: calc\nexports:\n"
                   "  - file: jira.jsonl\n    preset: jira\n    fields: {fix_commit: fields.customfield_1}\n")
    off = ingest(settings, IngestConfig(statements="off"), [cfg], client=docker_client)
    [raw] = off.result.tasks
    assert "test_add" in raw.spec.instruction and "statement" not in raw.spec.metadata
    [message] = raw.spec.metadata["failure_messages"].values()
    assert message.startswith("assert -1 == 5") and "add(2, 3)" in message  # pytest's own explanation

    report = ingest(settings, IngestConfig(statements="strict"), [cfg], client=docker_client)
    [task] = report.result.tasks
    statement = task.spec.metadata["statement"]
    assert statement["verdict"] == "repaired" and statement["original"] == raw.spec.instruction
    assert "test_add" not in task.spec.instruction and "Co-authored-by" not in task.spec.instruction
    assert "assert -1 == 5" in task.spec.instruction
    assert report.statements.verdicts == {"repaired": 1}
    [stored] = Catalog(settings.catalog_path).load_tasks(["calc-calc-9"])
    assert stored.spec.metadata["statement"]["verdict"] == "repaired" and "assert -1 == 5" in stored.spec.instruction


def test_a_suite_killed_for_memory_is_envforges_fault_and_derived_again_at_the_ceiling(tmp_path, settings,
                                                                                       docker_client):
    """A fix whose tests need more memory than the source's limit (xopen's zstd window needs 2 GiB, the
    default is 1 GiB): the after-run is OOM-killed. With no room above the limit that is a reject the
    funnel counts as envforge's (environment), never as "no failing-then-passing test"; with
    ENVFORGE_DERIVE_MEMORY_CEILING_MB above it, the candidate is derived once more there and the
    task keeps the raised limit."""
    from envforge.sources.funnel import classify
    from envforge.sources.history import load_history_source
    from tests.test_history_sources import commit, git

    repo = tmp_path / "big"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    commit(repo, "initial", {"big.py": "def small():\n    return b''\n",
                             "tests/test_big.py": "from big import small\n\n\ndef test_small():\n"
                                                  "    assert small() == b''\n"}, 0)
    fix = commit(repo, "Add a buffer of 600 MiB for the window", {
        "big.py": "def small():\n    return b''\n\n\ndef window():\n    return bytearray(600 * 2**20)\n",
        "tests/test_big.py": "from big import small\n\n\ndef test_small():\n    assert small() == b''\n\n\n"
                             "def test_window():\n    from big import window\n    buf = window()\n"
                             "    buf[::4096] = b'x' * len(buf[::4096])\n    assert len(buf) == 600 * 2**20\n"}, 1)
    (tmp_path / "h").mkdir()
    cfg = tmp_path / "h" / "history.yaml"
    cfg.write_text(f"repository: {repo}\nproject: big\nlimits: {{memory_mb: 400, workspace_mb: 64, tmp_mb: 64}}\n")
    [candidate] = load_history_source(cfg).candidates
    assert candidate.metadata["fix_commit"] == fix
    stuck = derive_tasks(settings, [candidate], client=docker_client, memory_ceiling_mb=0)
    [problem] = stuck.rejects
    assert "ran out of memory" in problem.reason and "limits.memory_mb: 400" in problem.reason, problem
    assert (classify(problem).stage, classify(problem).owner) == ("environment", "envforge")
    roomy = derive_tasks(settings, [candidate], client=docker_client, memory_ceiling_mb=1536)
    assert not roomy.rejects, roomy.rejects
    [task] = roomy.tasks
    assert task.spec.verification.tests.fail_to_pass == ["tests/test_big.py::test_window"]
    assert task.spec.environment.limits.memory_mb == 1536


def test_a_helper_only_the_tests_import_is_held_back_with_them(tmp_path, settings, docker_client):
    """A fix that adds a name to a helper on pytest's pythonpath and imports it in its tests: with the helper in
    the source change every test of the file failed to collect before the fix (all FAIL_TO_PASS); held back
    with the tests (sources/test_support.py), only the test the fix makes pass is."""
    import csv

    from tests.test_history_sources import CALC, TESTS, commit, git

    repo = tmp_path / "calc"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    helper = "FORK = True\n"
    commit(repo, "initial", {"calc.py": CALC, "pytest.ini": "[pytest]\npythonpath = helpers\n",
                             "helpers/probes.py": helper, "tests/test_calc.py": "from probes import FORK\n" + TESTS}, 0)
    fix = commit(repo, "Fix add", {
        "calc.py": CALC.replace("a - b", "a + b"),
        "helpers/probes.py": helper + "LINKS = True\n",
        "tests/test_calc.py": "from probes import FORK, LINKS\n" + TESTS + "\n\ndef test_add():\n    assert add(2, 3) == 5\n",
    }, 1)
    root = tmp_path / "tickets"
    root.mkdir()
    with open(root / "gh.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["number", "title", "body", "state", "labels", "closed_by_commit"])
        w.writerow(["1", "add() subtracts its arguments", "add(2, 3) returns -1 where 5 is expected.", "closed", "",
                    fix])
    (root / "tickets.yaml").write_text(f"repository: {repo}\nproject: calc\nexports:\n"
                                       "  - file: gh.csv\n    preset: github\n")
    [candidate] = load_ticket_source(root / "tickets.yaml").candidates
    assert candidate.change.support_files == ["helpers/probes.py"]
    result = derive_tasks(settings, [candidate], client=docker_client)
    [task] = result.tasks
    tests = task.spec.verification.tests
    assert tests.fail_to_pass == ["tests/test_calc.py::test_add"]
    assert tests.pass_to_pass == ["tests/test_calc.py::test_mul"]
    assert task.spec.metadata["test_support_files"] == ["helpers/probes.py"]
    assert "LINKS" in task.test_patch and "LINKS" not in (task.reference_patch or "")
