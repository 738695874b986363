"""Tickets with fix commits and code-review records: parsing, splitting, config errors, patch
series, discovery and fingerprints (no Docker here; derivation is in test_derive.py)."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest

from envforge.sources import discover_sources, fingerprint, load_sources
from envforge.sources.gitrepo import build_patch_series, materialize_repo, split_change
from envforge.sources.reviews import load_review_source
from envforge.sources.tickets import load_ticket_source

# The repositories live beside the sources under tmp_path: allowed as a deployment would allow them.
pytestmark = pytest.mark.usefixtures("allow_tmp_sources")

ENV = {"GIT_AUTHOR_NAME": "Dev", "GIT_AUTHOR_EMAIL": "dev@x.example", "GIT_COMMITTER_NAME": "CI",
       "GIT_COMMITTER_EMAIL": "ci@x.example", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}

CALC = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
TESTS = "from calc import add, mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"


def git(repo: Path, *args: str, date: str = "2024-01-01T10:00:00+00:00") -> str:
    import os
    env = {**os.environ, **ENV, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    return subprocess.run(["git", "-C", str(repo), "-c", "commit.gpgsign=false", *args], check=True,
                          capture_output=True, text=True, env=env).stdout.strip()


def commit(repo: Path, message: str, files: dict[str, str], n: int) -> str:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message, date=f"2024-01-{n + 1:02d}T10:00:00+00:00")
    return git(repo, "rev-parse", "HEAD")


def make_calc_repo(repo: Path) -> dict[str, str]:
    """A tiny history: a bug fix with its test, a docs-only commit, a characterization test,
    and a review pair (a change, then a follow-up with a test)."""
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    shas = {"initial": commit(repo, "initial", {"calc.py": CALC, "tests/test_calc.py": TESTS}, 0)}
    shas["fix"] = commit(repo, "Fix add (CALC-1) SECRET-FIX-MARKER", {
        "calc.py": CALC.replace("a - b", "a + b"),
        "tests/test_calc.py": TESTS + "\n\ndef test_add():\n    assert add(2, 3) == 5\n"}, 1)
    shas["docs"] = commit(repo, "docs", {"README.md": "calc\n"}, 2)
    shas["characterization"] = commit(repo, "mul: pin its behaviour at zero", {
        "calc.py": CALC.replace("a - b", "a + b").replace("return a * b", "product = a * b\n    return product"),
        "tests/test_calc.py": TESTS + "\n\ndef test_add():\n    assert add(2, 3) == 5\n"
                              "\n\ndef test_mul_zero():\n    assert mul(0, 5) == 0\n"}, 3)
    current = (repo / "calc.py").read_text()
    shas["change"] = commit(repo, "add div", {"calc.py": current + "\n\ndef div(a, b):\n    return a / b\n"}, 4)
    shas["follow_up"] = commit(repo, "div: raise a clear error on zero", {
        "calc.py": current + "\n\ndef div(a, b):\n    if b == 0:\n        raise ValueError('division by zero')\n"
                             "    return a / b\n",
        "tests/test_div.py": "import pytest\nfrom calc import div\n\n\ndef test_div_zero():\n"
                             "    with pytest.raises(ValueError):\n        div(1, 0)\n"}, 5)
    return shas


@pytest.fixture
def calc(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    repo = tmp_path / "calc"
    return repo, make_calc_repo(repo)


def write_ticket_source(root: Path, repo: Path, shas: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    jira = [
        {"key": "CALC-1", "fields": {"summary": "add() subtracts", "description": "2 + 3 gives -1.",
                                     "labels": ["math"], "customfield_1": shas["fix"]}},
        {"key": "CALC-2", "fields": {"description": "no summary here", "customfield_1": shas["fix"]}},
        {"key": "CALC-3", "fields": {"summary": "ghost fix", "customfield_1": "0123456789abcdef" * 2 + "01234567"}},
    ]
    (root / "jira.jsonl").write_text("\n".join(json.dumps(r) for r in jira) + "\n{not json\n")
    with open(root / "gh.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["number", "title", "body", "state", "labels", "closed_by_commit"])
        w.writerow(["7", "README is empty", "please, document it", "closed", "docs", shas["docs"]])
        w.writerow(["8", "mul of zero", "check it", "closed", "math;tests", shas["characterization"]])
    (root / "tickets.yaml").write_text(
        f"repository: {repo}\nproject: calc\nexports:\n"
        "  - file: jira.jsonl\n    preset: jira\n    fields: {fix_commit: fields.customfield_1}\n"
        "  - file: gh.csv\n    preset: github\n    id_prefix: gh\n")
    return root / "tickets.yaml"


def test_tickets_split_fix_into_solution_and_held_back_tests(calc, tmp_path):
    repo, shas = calc
    result = load_ticket_source(write_ticket_source(tmp_path / "tickets", repo, shas))
    ids = [c.id for c in result.candidates]
    assert ids == ["calc-calc-1", "calc-gh-8"]
    c = result.candidates[0]
    assert c.workspace_commit == shas["initial"]
    assert c.change.source_files == ["calc.py"] and c.change.test_files == ["tests/test_calc.py"]
    assert "a + b" in c.change.source_patch and "tests/" not in c.change.source_patch
    assert "test_add" in c.change.test_patch and "a/calc.py" not in c.change.test_patch
    assert c.instruction.startswith("Ticket CALC-1: add() subtracts") and "2 + 3" in c.instruction
    assert "SECRET-FIX-MARKER" not in c.instruction
    assert "math" in c.tags and c.metadata["fix_commit"] == shas["fix"]
    reasons = {(p.source.rsplit("/", 1)[-1], p.field): p.reason for p in result.rejects}
    assert reasons[("jira.jsonl:2", "fields.summary")].startswith("required field is missing")
    assert "does not exist in the repository" in reasons[("jira.jsonl:3", "fields.customfield_1")]
    assert reasons[("jira.jsonl:4", "")].startswith("not a JSON record")
    assert "changes no test files" in reasons[("gh.csv:row 1", "closed_by_commit")]
    assert len(result.rejects) == 4


def test_ticket_config_errors_name_the_file_and_field(calc, tmp_path):
    repo, shas = calc
    cfg = write_ticket_source(tmp_path / "t", repo, shas)
    cfg.write_text(f"repository: {repo}\nexports:\n  - file: jira.jsonl\n    preset: jiraa\n    fields: {{fixed: x}}\n"
                   "  - file: missing.csv\n    preset: github\n")
    result = load_ticket_source(cfg)
    assert not result.candidates
    fields = sorted(p.field for p in result.rejects)
    assert fields == ["exports[0].fields", "exports[0].preset"], result.rejects
    assert all(p.source == str(cfg) for p in result.rejects)
    cfg.write_text(f"repository: {tmp_path / 'nowhere'}\nexports:\n  - file: gh.csv\n    preset: github\n")
    [problem] = load_ticket_source(cfg).rejects
    assert problem.field == "repository" and "not a git repository" in problem.reason
    cfg.write_text(f"repository: {repo}\nexports:\n  - file: nope.csv\n    preset: github\n")
    [problem] = load_ticket_source(cfg).rejects
    assert problem.field == "exports[0].file" and "does not exist" in problem.reason


def write_review_source(root: Path, repo: Path, shas: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    good = {"id": "PR-3#c1", "repository": "acme/calc", "base_commit": shas["characterization"],
            "change_commit": shas["change"], "follow_up_commit": shas["follow_up"],
            "comment": {"author": "rev", "path": "calc.py", "line": 12, "body": "div(1, 0) should raise a clear "
                                                                               "ValueError, not ZeroDivisionError"}}
    records = [good, {k: v for k, v in good.items() if k != "comment"} | {"id": "PR-3#c2"},
               good | {"id": "PR-3#c3", "follow_up_commit": "f" * 40},
               good | {"id": "PR-3#c4", "follow_up_commit": shas["fix"]},
               good | {"id": "PR-3#c5", "repository": "acme/other"}]
    (root / "reviews.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    (root / "reviews.yaml").write_text(f"repos:\n  acme/calc: {repo}\n")
    return root / "reviews.yaml"


def test_review_records_become_address_the_comment_candidates(calc, tmp_path):
    repo, shas = calc
    result = load_review_source(write_review_source(tmp_path / "reviews", repo, shas))
    [c] = result.candidates
    assert c.id == "calc-review-pr-3-c1" and c.kind == "review"
    assert c.workspace_commit == shas["change"]
    assert "> div(1, 0) should raise" in c.instruction and "calc.py:12 by rev" in c.instruction
    assert "+def div(a, b):" in c.instruction  # the change under review is shown
    assert "division by zero" not in c.instruction  # the follow-up is not
    assert c.change.test_files == ["tests/test_div.py"] and c.change.source_files == ["calc.py"]
    reasons = {p.source.rsplit(":", 1)[-1] + "/" + p.field: p.reason for p in result.rejects}
    assert reasons["2/comment"] == "required field is missing"
    assert "does not exist" in reasons["3/follow_up_commit"]
    assert "does not build on change_commit" in reasons["4/follow_up_commit"]
    assert "no local repository" in reasons["5/repository"]


def test_patch_series_rebuilds_identical_commits(calc, tmp_path):
    repo, shas = calc
    project = tmp_path / "project"
    (project / "patches").mkdir(parents=True)
    git(repo, "format-patch", "-q", "-k", "--zero-commit", "--no-signature", "--root", "-o",
        str(project / "patches"), "main")
    (project / "repo.yaml").write_text("committer: {name: CI, email: ci@x.example}\n")
    one = build_patch_series(project, tmp_path / "one")
    two = build_patch_series(project, tmp_path / "two")
    log = lambda r: git(r, "log", "--format=%H", "main")  # noqa: E731
    assert log(one) == log(two) == log(repo)
    cached = materialize_repo(project)
    assert log(cached) == log(repo) and materialize_repo(project) == cached
    split = split_change(cached, shas["initial"], shas["fix"])
    assert split.source_files == ["calc.py"]


def test_discovery_finds_every_kind_and_fingerprints_follow_edits(calc, tmp_path):
    repo, shas = calc
    root = tmp_path / "sources"
    write_ticket_source(root / "tickets", repo, shas)
    write_review_source(root / "reviews", repo, shas)
    (root / "swe").mkdir()
    (root / "swe" / "swebench.yaml").write_text(f"repos:\n  acme/calc: {repo}\n")
    (root / "swe" / "instances.jsonl").write_text("")
    (root / "runbooks").mkdir()
    (root / "runbooks" / "README.md").write_text("# not a runbook\n")
    refs, problems = discover_sources([root, tmp_path / "missing"])
    assert sorted((r.kind, r.key(root)) for r in refs) == [
        ("review", "reviews/reviews.yaml"), ("swebench", "swe/instances.jsonl"), ("ticket", "tickets/tickets.yaml")]
    assert problems[0].reason == "no such file or directory"
    ticket = next(r for r in refs if r.kind == "ticket")
    before = fingerprint(ticket)
    assert fingerprint(ticket) == before
    with open(root / "tickets" / "gh.csv", "a") as fh:
        fh.write("9,new,b,closed,,abc\n")
    assert fingerprint(ticket) != before
    review = next(r for r in refs if r.kind == "review")
    before = fingerprint(review)
    commit(repo, "more", {"x.txt": "x"}, 9)
    assert fingerprint(review) != before  # the repository moved
    by_kind = load_sources([root])
    assert len(by_kind["ticket"].candidates) == 2 and len(by_kind["review"].candidates) == 1


def test_a_commit_outside_the_commit_store_is_read_through_the_callers_repository_dir(calc, tmp_path, settings):
    """The sandbox is below the sources: a history task's commit that envforge's store does not hold
    yet is read from the repository its caller's `repository_dir` finds; with none given, a clear error."""
    from envforge.errors import ImageBuildError
    from envforge.sandbox.images import workspace_file
    from envforge.sources.gitrepo import repository_dir

    repo, shas = calc
    [task, _] = [c.provisional_task() for c in load_ticket_source(write_ticket_source(tmp_path / "t", repo, shas))
                 .candidates]
    with pytest.raises(ImageBuildError, match=rf"task {task.id}: environment.repository: commit {shas['initial']} "
                                              "is not in envforge's commit store"):
        workspace_file(task, settings, "calc.py")
    assert workspace_file(task, settings, "calc.py", repository_dir) == CALC.encode()
