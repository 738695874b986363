"""Plain git history as a task source: no ticket export needed.

A `history.yaml` names a repository and which of its commits to consider; every commit that
changes both source and test files (the SWE-rebench-style pre-filter) and passes the filters
becomes a candidate, exactly like a ticket's fix commit: the source change is the reference
solution, the test change is held back, FAIL_TO_PASS is derived by running the suite before and
after (`sources.derive`), and the task goes through the statement check and the gate like any
other. The statement is the linked issue's title and body when the message says `Fixes #526`
and an issue export has #526, else the commit message (which the statement check cleans and,
when it is only a subject line, describes by the failure the tests showed). A merge on the
branch's line is the pull request it merges (`sources.commits`): its change against its first
parent, its statement from its own body or its commits.

    repository: ../billing.bundle     # git dir, .bundle or patch-series project (relative to this file)
    project: billing                  # task ids become <project>-<sha12>
    range: {branch: main, last: 50, since: v1.4}   # since: a tag/ref (commits after it) or a date
    filters:                          # defaults shown in HistoryFilters
      skip_authors: ["*[bot]"]
      skip_messages: ["^(?i)bump "]
    issues: [{file: issues.csv, preset: github}]   # optional: the tracker's own statements
    tests: {command: python3 -m pytest}             # as every history source (tickets, reviews)

Commits the filters leave out are not rejects (a docs commit is not a bad record): they are
listed with their reason in `LoadResult.skipped`, which `envforge sources scan` shows. The defaults
also leave out, before any sandbox time, commits whose message or shape rules out a failing-then-
passing test: refactor, performance, lint, typing and tooling subjects (`skip_subjects`), changes to
tooling files only, test changes that only remove tests, behaviour-neutral changes (`change_shape`).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import date
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import Field, StrictStr, field_validator

from envforge.errors import Problem, SpecError
from envforge.gitstore import file_text
from envforge.sources import guard
from envforge.sources.candidate import (
    Candidate,
    HistorySourceConfig,
    check_repo_footprint,
    load_config,
    open_repository,
    relative_to_source,
    slug,
)
from envforge.sources.change_shape import behaviour_neutral, only_removes_tests
from envforge.sources.commits import Commit, log_commits, merge_statement, merged_commits, pull_request_number
from envforge.sources.fields import Ref, StrictModel
from envforge.sources.gitrepo import SplitChange, resolve_commit, split_change
from envforge.sources.policy import SourcePolicy
from envforge.sources.records import blank, get_path, iter_records
from envforge.sources.result import LoadResult
from envforge.sources.tickets import PRESETS
from envforge.task import check_regex

CONFIG_NAME = "history.yaml"
MAX_SCAN = 5000  # commits examined at most per load, newest first
MIN_STATEMENT_CHARS = 10  # as TaskSpec.instruction

DEPENDENCY_FILES = (
    "requirements*.txt",
    "requirements/*.txt",
    "*.lock",
    "Pipfile",
    "Pipfile.lock",
    "poetry.lock",
    "uv.lock",
    "pdm.lock",
    "constraints*.txt",
    "package.json",
    "package-lock.json",
    "yarn.lock",
    "go.sum",
    "Cargo.lock",
    "renovate.json",
    ".pre-commit-config.yaml",
)
DOCS_FILES = (
    "*.md",
    "*.rst",
    "*.txt",
    "docs/*",
    "doc/*",
    "CHANGELOG*",
    "CHANGES*",
    "HISTORY*",
    "NEWS*",
    "AUTHORS*",
    "LICENSE*",
    ".github/*",
    ".gitlab-ci.yml",
    ".circleci/*",
    "azure-pipelines.yml",
    ".travis.yml",
    "appveyor.yml",
    ".readthedocs.y*ml",
    "mkdocs.yml",
    "*.cfg.example",
)
# Build, lint, release and benchmark tooling: a commit whose non-test change touches only these (with
# docs and dependency files) changes no importable package code, so no test can fail-then-pass on it.
TOOLING_FILES = (
    "pyproject.toml",
    "setup.cfg",
    "setup.py",
    "tox.ini",
    "tox.toml",
    "noxfile.py",
    "Makefile",
    "MANIFEST.in",
    ".gitignore",
    ".gitattributes",
    ".git-blame-ignore-revs",
    ".editorconfig",
    ".coveragerc",
    ".flake8",
    "mypy.ini",
    ".mypy.ini",
    "ruff.toml",
    ".ruff.toml",
    ".pylintrc",
    "pylintrc",
    "codecov.y*ml",
    ".codecov.y*ml",
    ".pre-commit-hooks.yaml",
    "Dockerfile",
    "benchmarks/*",
    "benchmark/*",
    "bench/*",
    "asv_bench/*",
    "profiler/*",
    "profiling/*",
    "fuzz/*",
    "fuzzer/*",
    "fuzzing/*",
    "scripts/*",
    "tools/*",
    "ci/*",
    "examples/*",
    "releasenotes/*",
    "changelog.d/*",
    "newsfragments/*",
)
# Commit subjects of the kinds that SWE-rebench-style pre-filters leave out: their changes keep
# behaviour (refactors, lint, formatting, typing, performance) or change tooling, so no test fails
# before them. Matched against the subject line only, case-insensitive; the name is the reason shown.
SKIP_SUBJECTS = {
    # gitmoji first (`🔧 fix(type): ...`) is still a conventional subject; a typing or lint scope of any type too
    "non-behavioural conventional type": r"^\W*((refactor|style|perf|chore|ci|build|docs?|tests?|typing|lint)"
    r"(\([^)]*\))?|\w+\((types?|typing|typecheck|lint|style|format|ci|docs?)\))!?:",
    "refactor or cleanup": r"^(minor |small |code |some )?(refactor\w*|clean[ -]?ups?|cleaned up|clean up|tidy\b)",
    "performance": r"\b(performance|speed[ -]?ups?|speed up|faster|optimi[sz]\w*|import time|memory usage)\b",
    "lint or format": r"\b(ruff|flake8|pylint|isort|pre-commit|black|lint\w*|reformat\w*|pyupgrade)\b",
    "typing": r"^\W*(update|upgrade|bump|pin|unpin|run|enable|add|use|fix|improve)\b.*"
    r"\b(mypy|pyright|pyre|type hints?|type annotations?)\b",
    "tooling bump": r"^(update|upgrade|bump|pin|unpin)\b.*\b(tox|nox|pytest|setuptools|hatch\w*|sphinx|coverage|"
    r"actions?|ci|dependencies|deps|requirements)\b",
    "build or packaging": r"\b(wheels?|sdist|mypyc|cibuildwheel|manylinux)\b",
    "removal of deprecated or dropped support": r"^(drop|dropped|dropping|remove[sd]?|removing)\b.*"
    r"\b(deprecat\w*|support for|python ?[23](\.\d+)?\b|py[23]\d+)",
}
_LINK = re.compile(
    r"\b(?:fix(?:es|ed)?|close[sd]?|resolve[sd]?)\s*:?\s+(?:[\w.-]+/[\w.-]+)?#(\d+)\b|"
    r"\b(?:fix(?:es|ed)?|close[sd]?|resolve[sd]?)\s*:?\s+([A-Z][A-Z0-9]{1,9}-\d+)\b",
    re.I,
)


class HistoryRange(StrictModel):
    branch: Ref = Field("HEAD", description="the branch (or ref) whose first-parent history is read")
    last: int | None = Field(
        None, ge=1, le=MAX_SCAN, description="at most this many candidates, newest first (counted after the filters)"
    )
    since: StrictStr | None = Field(
        None, description="only commits after this tag/ref, or committed on or after this date (YYYY-MM-DD)"
    )


class HistoryFilters(StrictModel):
    skip_merges: bool = Field(
        False,
        description="merge commits on the branch's line are left out; when false (the default) each is taken as "
        "the merged pull request: its change against its first parent, its statement from the merge message's "
        "body or the merged commits, the other filters applied to those",
    )
    max_merged_commits: int = Field(
        30,
        ge=1,
        le=MAX_SCAN,
        description="a merge that brings more commits than this is a branch sync or release merge, not one "
        "pull request, and is left out",
    )
    skip_authors: list[StrictStr] = Field(
        default_factory=lambda: ["*[bot]*", "dependabot*", "renovate*", "pre-commit-ci*", "github-actions*"],
        description="author names or emails whose commits are left out: `*` and `?` are wildcards, everything "
        "else is literal (so `*[bot]*` is a name holding `[bot]`), case-insensitive",
    )
    skip_messages: list[StrictStr] = Field(
        default_factory=lambda: [
            r"(?i)^(bump|build\(deps\)|chore\(deps\)|update dependency|\[pre-commit\.ci\])",
            r"(?i)^revert\b",
            r"(?i)^(release|prepare release|version bump)\b",
        ],
        description="regular expressions on the commit message; a match leaves the commit out",
    )
    dependency_files: list[StrictStr] = Field(
        default_factory=lambda: list(DEPENDENCY_FILES),
        description="a commit whose non-test change touches only these (glob) is a dependency bump",
    )
    docs_files: list[StrictStr] = Field(
        default_factory=lambda: list(DOCS_FILES),
        description="a commit whose non-test change touches only these (glob) is docs or CI only",
    )
    tooling_files: list[StrictStr] = Field(
        default_factory=lambda: list(TOOLING_FILES),
        description="build, lint, release and benchmark files (glob): a commit whose non-test change touches "
        "only these, docs and dependency files changes no package code",
    )
    skip_subjects: dict[StrictStr, StrictStr] = Field(
        default_factory=lambda: dict(SKIP_SUBJECTS),
        description="name -> regular expression on the commit's subject line (case-insensitive); a match leaves "
        "the commit out with the name as the reason. Giving it replaces the defaults ({} turns them off)",
    )
    skip_test_removals: bool = Field(
        True, description="a commit whose test change only removes tests is left out (no test can fail-then-pass)"
    )
    skip_neutral_changes: bool = Field(
        True,
        description="a commit whose package code change is behaviour-neutral (the Python syntax tree is the same "
        "without annotations, docstrings and typing-only code: type, lint or format commits) is left out",
    )

    @field_validator("skip_messages")
    @classmethod
    def _compiles(cls, v: list[str]) -> list[str]:
        return [check_regex(pattern) for pattern in v]

    @field_validator("skip_subjects")
    @classmethod
    def _subjects_compile(cls, v: dict[str, str]) -> dict[str, str]:
        for name, pattern in v.items():
            try:
                check_regex(pattern)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        return v


class IssueExport(StrictModel):
    file: StrictStr = Field(description="an issue export (JSONL or CSV), relative to history.yaml")
    format: Literal["jsonl", "csv"] | None = None
    preset: Literal["jira", "jira-csv", "github", "none"] = "github"
    fields: dict[str, str] = Field(default_factory=dict, description="id/title/body -> export field (dotted)")

    def field_map(self) -> dict[str, str]:
        base = {k: v for k, v in PRESETS.get(self.preset, {}).items() if k in ("id", "title", "body")}
        return {**base, **self.fields}


class HistoryConfig(HistorySourceConfig):
    repository: StrictStr = Field(description="git directory, .bundle file or patch-series project")
    project: StrictStr | None = Field(None, description="task id prefix; default: the repository folder's name")
    range: HistoryRange = Field(default_factory=lambda: HistoryRange.model_validate({}))
    filters: HistoryFilters = Field(default_factory=lambda: HistoryFilters.model_validate({}))
    issues: list[IssueExport] = Field(default_factory=list)


def read_commits(git_dir: Path, rng: HistoryRange) -> list[Commit]:
    """The branch's first-parent commits, newest first, within the range (at most MAX_SCAN examined)."""
    rev = resolve_commit(git_dir, rng.branch)
    if rev is None:
        raise ValueError(f"range.branch: {rng.branch!r} does not name a commit in the repository")
    args = ["--first-parent", f"--max-count={MAX_SCAN}"]
    if rng.since:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", rng.since):
            try:
                date.fromisoformat(rng.since)
            except ValueError:
                raise ValueError(f"range.since: {rng.since!r} is not a date") from None
            args.append(f"--since={rng.since}T00:00:00")
            spec = rev
        else:
            base = resolve_commit(git_dir, rng.since)
            if base is None:
                raise ValueError(
                    f"range.since: {rng.since!r} is neither a date (YYYY-MM-DD) nor a ref in the repository"
                )
            spec = f"{base}..{rev}"
    else:
        spec = rev
    return log_commits(git_dir, *args, spec)


def _globbed(path: str, patterns: list[str]) -> bool:
    name = path.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(name, p) for p in patterns)


def author_matches(who: str, pattern: str) -> bool:
    """`pattern` against an author's name or email, case-insensitive, with `*` and `?` as the only
    wildcards. fnmatch would read `[bot]` as a character class, so the default `*[bot]*` would
    match every name holding a b, an o or a t and leave nearly every commit out."""
    regex = "".join(".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern.lower())
    return re.fullmatch(regex, who.lower(), re.S) is not None


def skip_reason(commit: Commit, filters: HistoryFilters) -> str | None:
    """Why the commit is not a candidate by its metadata alone (None: look at its change). A merge
    is judged as the pull request it merges (`pull_request`), not by its own merge line."""
    if commit.is_merge:
        return "merge commit"
    if not commit.parents:
        return "root commit: there is no state before it"
    if pattern := _skipped_author(commit, filters):
        return f"author {commit.author} <{commit.email}> matches skip_authors {pattern!r}"
    for pattern in filters.skip_messages:
        if re.search(pattern, commit.message, re.M):
            return f"message matches skip_messages {pattern!r}"
    subject = commit.message.split("\n", 1)[0]
    for name, pattern in filters.skip_subjects.items():
        if re.search(pattern, subject, re.I):
            return f"{name} commit (subject matches skip_subjects.{name})"
    return None


def _skipped_author(commit: Commit, filters: HistoryFilters) -> str | None:
    """The skip_authors pattern the commit's author name or email matches, if any."""
    for pattern in filters.skip_authors:
        if author_matches(commit.author, pattern) or author_matches(commit.email, pattern):
            return pattern
    return None


def pull_request(git_dir: Path, merge: Commit, filters: HistoryFilters) -> tuple[Commit, list[Commit]] | str:
    """A merge on the branch's line as the pull request it merges: a commit whose parent is the merge's
    first parent and whose message is the request's statement, with the commits it brings; or why it
    is not one (the filters' reason)."""
    if filters.skip_merges:
        return "merge commit (filters.skip_merges)"
    try:
        merged = merged_commits(git_dir, merge, filters.max_merged_commits)
    except ValueError as exc:  # a bundle or shallow clone that holds the merge but not its other side
        return f"merge commit whose merged commits are not in the repository ({exc})"
    if not merged:
        return "merge commit that brings no commits"
    if len(merged) > filters.max_merged_commits:
        return (
            f"merge of more than {filters.max_merged_commits} commits (filters.max_merged_commits): "
            "a branch sync or release merge, not one pull request"
        )
    own = [c for c in merged if not c.is_merge] or merged
    humans = [c for c in own if not _skipped_author(c, filters)]
    if not humans:
        return f"every merged commit's author matches skip_authors (the first: {own[-1].author} <{own[-1].email}>)"
    # the request's author is its first commit's, not the merge's: a maintainer or a merge bot clicked merge
    author = humans[-1]
    view = replace(
        merge,
        parents=merge.parents[:1],
        author=author.author,
        email=author.email,
        message=merge_statement(merge, merged),
    )
    if not view.message:
        return "merge commit with no message of its own or of its commits"
    return view, merged


def change_skip_reason(
    change: SplitChange, filters: HistoryFilters, read: Callable[[str, str], str | None] | None = None
) -> str | None:
    """Why the commit's change cannot be a task (None: it can). `read(side, path)` gives a changed
    file's text before ("old") or after ("new") the commit, for the behaviour-neutral check."""
    source_files, test_files = change.source_files, change.test_files
    if not test_files:
        return "changes no test files (nothing to verify it with)"
    if not source_files:
        return "changes only tests (no source change to ask for)"
    if all(_globbed(p, filters.dependency_files) for p in source_files):
        return "dependency bump (its non-test change touches only dependency files)"
    if all(_globbed(p, filters.docs_files) for p in source_files):
        return "docs or CI only (its non-test change touches only docs/CI files)"
    not_code = filters.dependency_files + filters.docs_files + filters.tooling_files
    package_files = [p for p in source_files if not _globbed(p, not_code)]
    if not package_files:
        return "tooling only (its non-test change touches no package code: build, lint, benchmark, docs files)"
    if filters.skip_test_removals and only_removes_tests(change.test_patch):
        return "its test change only removes tests (no test can fail before it and pass after it)"
    if filters.skip_neutral_changes and read is not None and behaviour_neutral(package_files, read):
        return "behaviour-neutral package change (same syntax tree without annotations, docstrings, comments)"
    return None


def file_reader(git_dir: Path, old: str, new: str) -> Callable[[str, str], str | None]:
    """`read(side, path)` over two commits of a repository: the file's text, None when absent."""

    def read(side: str, path: str) -> str | None:
        return file_text(git_dir, old if side == "old" else new, path)

    return read


def load_issues(
    config_path: Path, exports: list[IssueExport], policy: SourcePolicy, result: LoadResult
) -> dict[str, tuple[str, str, str]]:
    """Issue id -> (title, body, where) from the exports; unreadable records are rejects."""
    issues: dict[str, tuple[str, str, str]] = {}
    for i, export in enumerate(exports):
        field = f"issues[{i}].file"
        try:
            path = guard.confined(config_path.parent, export.file, str(config_path), field, policy)
        except SpecError as exc:
            result.rejects.extend(exc.problems)
            continue
        if not path.exists():
            result.rejects.append(Problem(str(config_path), field, f"{path} does not exist"))
            continue
        fmap = export.field_map()
        for where, rec in iter_records(path, export.format, policy):
            if isinstance(rec, Problem):
                result.rejects.append(rec)
                continue
            values = {k: get_path(rec, v) for k, v in fmap.items()}
            if blank(values.get("id")) or blank(values.get("title")) or not isinstance(values.get("title"), str):
                result.rejects.append(Problem(where, fmap.get("title", "title"), "an issue needs an id and a title"))
                continue
            body = values.get("body") if isinstance(values.get("body"), str) else ""
            title = guard.check_text(str(values["title"]), where, fmap["title"], policy).strip()
            body = guard.check_text(str(body or ""), where, fmap.get("body", "body"), policy).strip()
            issues[str(values["id"]).lstrip("#")] = (title, body, where)
    return issues


def linked_issue(message: str, issues: dict[str, tuple[str, str, str]]) -> tuple[str, tuple[str, str, str]] | None:
    for match in _LINK.finditer(message):
        key = match.group(1) or match.group(2)
        if key in issues:
            return key, issues[key]
    return None


def load_history_source(config_path: Path, policy: SourcePolicy | None = None) -> LoadResult:
    """Every commit of the range that passes the filters and changes source and tests, as a candidate;
    commits left out are in `skipped` with why, bad config and issue records are rejects."""
    policy = policy or SourcePolicy.from_env()
    result = LoadResult()
    try:
        cfg = cast(HistoryConfig, load_config(config_path, HistoryConfig, policy))
        git_dir = open_repository(config_path, "repository", cfg.repository, policy)
        commits = read_commits(git_dir, cfg.range)
    except SpecError as exc:
        result.rejects.extend(exc.problems)
        return result
    except ValueError as exc:
        field, _, detail = str(exc).partition(": ")
        result.rejects.append(Problem(str(config_path), field if detail else "range", detail or str(exc)))
        return result
    result.cursor = resolve_commit(git_dir, cfg.range.branch)
    base_dir = config_path.parent
    project = cfg.project or (base_dir / cfg.repository).resolve().name.removesuffix(".bundle")
    issues = load_issues(config_path, cfg.issues, policy, result)
    for commit in commits:
        if cfg.range.last is not None and len(result.candidates) >= cfg.range.last:
            break
        where = f"{config_path}:{commit.sha[:12]}"
        merge: Commit | None = None
        merged: list[Commit] = []
        if commit.is_merge:
            judged = pull_request(git_dir, commit, cfg.filters)
            if isinstance(judged, str):
                result.skipped.append(Problem(where, "commit", judged))
                continue
            merge, (commit, merged) = commit, judged
        reason: str | None = skip_reason(commit, cfg.filters)
        if reason is None:
            try:
                change = split_change(git_dir, commit.parents[0], commit.sha)
            except ValueError as exc:
                result.rejects.append(Problem(where, "commit", str(exc)))
                continue
            reason = change_skip_reason(change, cfg.filters, file_reader(git_dir, commit.parents[0], commit.sha))
        if reason is not None:
            result.skipped.append(Problem(where, "commit", reason))
            continue
        try:
            result.candidates.append(
                _candidate(commit, change, cfg, git_dir, project, base_dir, where, issues, policy, merge, merged)
            )
        except SpecError as exc:
            result.rejects.extend(exc.problems)
    return result


def _candidate(
    commit: Commit,
    change: Any,
    cfg: HistoryConfig,
    git_dir: Path,
    project: str,
    base_dir: Path,
    where: str,
    issues: dict[str, tuple[str, str, str]],
    policy: SourcePolicy,
    merge: Commit | None = None,
    merged: Sequence[Commit] = (),
) -> Candidate:
    """`merge`, `merged`: when `commit` stands for a merged pull request, the merge itself and the
    commits it brings (any of their messages may name the issue it fixes)."""
    parent = commit.parents[0]
    check_repo_footprint(git_dir, parent, cfg.limits, where, "commit")
    message = guard.check_text(commit.message, where, "message", policy).strip()
    metadata: dict[str, Any] = {
        "repo": project,
        "fix_commit": commit.sha,
        "base_commit": parent,
        "author": commit.author,
        "committed_at": commit.committed,
    }
    said = [message]
    if merge is not None:
        metadata.update(merged_commits=[c.sha for c in merged])  # fix_commit is the merge
        if number := pull_request_number(merge):
            metadata.update(pull_request=number)
        said += [merge.message, *(c.message for c in merged)]  # `Fixes #N` may be in any of them
    link = linked_issue("\n\n".join(said), issues)
    if link is not None:
        key, (title, body, issue_where) = link
        instruction = f"{title}\n\n{body}".strip()
        metadata.update(issue=key, issue_record=issue_where)
    else:
        instruction = message
    if len(instruction) < MIN_STATEMENT_CHARS:
        # A short subject ("sub", "fix") is not on its own a lost candidate: the statement check
        # describes a commit-derived task by the failure its tests showed. Until then the task needs a
        # statement of at least MIN_STATEMENT_CHARS; envforge's own `Commit X:` prefix, which the
        # statement check cleans off like the tickets' `Ticket X:`, makes one without inventing words.
        instruction = f"Commit {commit.sha[:12]}: {instruction}".strip()
    candidate = Candidate(
        id=slug(f"{project}-{commit.sha[:12]}"),
        kind="history",
        origin=where,
        field="commit",
        instruction=instruction,
        git_dir=git_dir,
        workspace_commit=parent,
        change=change,
        config=cfg,
        base_dir=base_dir,
        tags=["history"],
        metadata=metadata,
        repository=relative_to_source(cfg.repository, base_dir),
    )
    candidate.provisional_task()  # the spec is checked before any sandbox time
    return candidate


__all__ = [
    "CONFIG_NAME",
    "HistoryConfig",
    "HistoryFilters",
    "HistoryRange",
    "IssueExport",
    "load_history_source",
    "read_commits",
]
