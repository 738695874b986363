"""Merged pull requests in plain history: a merge on the branch's line is the pull request it
merges (its change against its first parent, its statement from its own body or its commits), and
merges that are not one pull request (bots', branch syncs, `skip_merges`) are skipped with why."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from envforge.sources.gitrepo import split_change
from envforge.sources.history import load_history_source
from tests.test_history_kind import write_history
from tests.test_history_sources import CALC, ENV, TESTS, commit, git

pytestmark = pytest.mark.usefixtures("allow_tmp_sources")
BOT = {"GIT_AUTHOR_NAME": "dependabot[bot]", "GIT_AUTHOR_EMAIL": "49699333+dependabot[bot]@users.noreply.github.com"}


def _commit_as(repo: Path, who: dict[str, str], message: str, files: dict[str, str], n: int) -> str:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    env = {**os.environ, **ENV, **who, "GIT_AUTHOR_DATE": f"2024-02-{n:02d}T10:00:00+00:00",
           "GIT_COMMITTER_DATE": f"2024-02-{n:02d}T10:00:00+00:00"}
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "-c", "commit.gpgsign=false", "commit", "-qm", message], check=True, env=env)
    return git(repo, "rev-parse", "HEAD")


def _merge(repo: Path, branch: str, message: str, n: int) -> str:
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "-m", message, branch, date=f"2024-02-{n:02d}T12:00:00+00:00")
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def merged_repo(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """main: initial; then four branches merged with merge commits, as GitHub's "Create a merge commit" does."""
    repo = tmp_path / "calc"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    shas = {"initial": commit(repo, "initial", {"calc.py": CALC, "tests/test_calc.py": TESTS}, 0)}
    # a pull request of two commits, the title and description in the merge message (GitHub's default)
    git(repo, "checkout", "-q", "-b", "fix-add")
    shas["pr_first"] = _commit_as(repo, {}, "wip", {"calc.py": CALC.replace("a - b", "a + b")}, 1)
    shas["pr_second"] = _commit_as(repo, {}, "test add", {
        "tests/test_calc.py": TESTS + "\n\ndef test_add():\n    assert add(2, 3) == 5\n"}, 2)
    shas["pr"] = _merge(repo, "fix-add", "Merge pull request #7 from dev/fix-add\n\nadd() subtracts its arguments\n\n"
                                         "add(2, 3) gives -1 where the docs promise 5.", 3)
    # a bot's dependency bump, merged
    git(repo, "checkout", "-q", "-b", "dependabot/pip/pytest-8")
    _commit_as(repo, BOT, "Update pytest", {"requirements-dev.txt": "pytest==8\n",
                                            "tests/test_calc.py": (repo / "tests/test_calc.py").read_text() + "\n"}, 4)
    shas["bot"] = _merge(repo, "dependabot/pip/pytest-8", "Merge pull request #8 from dev/dependabot/pip/pytest-8", 5)
    # a bare `git merge` line: the statement and the issue link come from the merged commit
    git(repo, "checkout", "-q", "-b", "neg")
    shas["neg_commit"] = _commit_as(repo, {}, "add neg\n\nFixes #42", {
        "calc.py": (repo / "calc.py").read_text() + "\n\ndef neg(a):\n    return -a\n",
        "tests/test_neg.py": "from calc import neg\n\n\ndef test_neg():\n    assert neg(3) == -3\n"}, 6)
    shas["bare"] = _merge(repo, "neg", "Merge branch 'neg'", 7)
    # a long-lived branch of three commits merged back: more than max_merged_commits (2 in these tests)
    git(repo, "checkout", "-q", "-b", "release")
    for i in range(3):
        _commit_as(repo, {}, f"mul: step {i}", {"calc.py": (repo / "calc.py").read_text() + f"\n# step {i}\n",
                                                 f"tests/test_step{i}.py": "def test_ok():\n    assert True\n"}, 8 + i)
    shas["sync"] = _merge(repo, "release", "Merge branch 'release'", 11)
    return repo, shas


def test_a_merged_pull_request_is_one_candidate_with_its_whole_change_and_its_own_words(merged_repo, tmp_path):
    repo, shas = merged_repo
    result = load_history_source(write_history(tmp_path / "h", repo, "filters: {max_merged_commits: 2}\n"))
    by_sha = {c.metadata["fix_commit"]: c for c in result.candidates}
    assert set(by_sha) == {shas["pr"], shas["bare"]}, result.skipped
    pr = by_sha[shas["pr"]]
    assert pr.workspace_commit == shas["initial"]  # the branch before the merge, not the PR's last commit
    whole = split_change(repo, shas["initial"], shas["pr"])
    assert (pr.change.source_patch, pr.change.test_patch) == (whole.source_patch, whole.test_patch)
    assert pr.change.source_files == ["calc.py"] and pr.change.test_files == ["tests/test_calc.py"]
    assert pr.instruction == "add() subtracts its arguments\n\nadd(2, 3) gives -1 where the docs promise 5."
    assert pr.metadata["pull_request"] == "7" and pr.metadata["author"] == "Dev"
    assert pr.metadata["merged_commits"] == [shas["pr_second"], shas["pr_first"]]
    bare = by_sha[shas["bare"]]
    assert bare.metadata["issue"] == "42"  # `Fixes #42` in the merged commit links the tracker's words
    assert bare.instruction.startswith("calc cannot negate a number")
    assert "pull_request" not in bare.metadata
    skipped = {p.source.rsplit(":", 1)[1]: p.reason for p in result.skipped}
    assert skipped[shas["bot"][:12]].startswith("every merged commit's author matches skip_authors")
    assert skipped[shas["sync"][:12]].startswith("merge of more than 2 commits (filters.max_merged_commits)")
    assert result.rejects == []


def test_merges_are_left_out_when_asked_and_their_message_is_filtered_as_a_commits_is(merged_repo, tmp_path):
    repo, shas = merged_repo
    off = load_history_source(write_history(tmp_path / "a", repo, "filters: {skip_merges: true}\n"))
    assert off.candidates == []
    assert {p.reason for p in off.skipped if not p.reason.startswith("root")} == {"merge commit (filters.skip_merges)"}
    # the pull request's title is what skip_subjects reads, not `Merge pull request #7 ...`
    subjects = load_history_source(write_history(tmp_path / "b", repo,
                                                 "filters: {max_merged_commits: 2, skip_subjects: {add: '^add'}}\n"))
    reasons = {p.source.rsplit(":", 1)[1]: p.reason for p in subjects.skipped}
    assert reasons[shas["pr"][:12]] == "add commit (subject matches skip_subjects.add)"
    assert [c.metadata["fix_commit"] for c in subjects.candidates] == []  # `add neg` too


def test_a_merge_whose_other_side_is_missing_is_skipped_not_an_error(merged_repo):
    """A bundle of recent history may hold a merge but not the commits on its second parent."""
    from envforge.sources.commits import Commit
    from envforge.sources.history import HistoryFilters, pull_request

    repo, shas = merged_repo
    orphan = Commit("e" * 40, (shas["initial"], "f" * 40), "Dev", "dev@x.example", "2024-03-01T00:00:00Z",
                    "Merge pull request #9 from dev/gone")
    reason = pull_request(repo, orphan, HistoryFilters.model_validate({}))
    assert isinstance(reason, str) and reason.startswith("merge commit whose merged commits are not in the repository")


@pytest.mark.docker
def test_merged_pull_requests_are_ingested_with_their_fail_to_pass_derived(merged_repo, tmp_path, settings,
                                                                          docker_client):
    """The merge's change against its first parent goes through the derivation and the statement
    check like a commit's: the pull request's tests are its FAIL_TO_PASS."""
    from envforge.stages.configs import IngestConfig
    from envforge.stages.ingest import ingest

    repo, shas = merged_repo
    cfg = write_history(tmp_path / "h", repo, "filters: {max_merged_commits: 2}\n")
    report = ingest(settings, IngestConfig(), [cfg], client=docker_client)
    [source] = report.sources
    assert source.result.rejects == []
    tasks = {t.spec.metadata["fix_commit"]: t for t in source.result.tasks}
    assert tasks[shas["pr"]].spec.verification.tests.fail_to_pass == ["tests/test_calc.py::test_add"]
    assert tasks[shas["bare"]].spec.verification.tests.fail_to_pass == ["tests/test_neg.py::test_neg"]
    assert tasks[shas["pr"]].spec.instruction.startswith("add() subtracts its arguments")
