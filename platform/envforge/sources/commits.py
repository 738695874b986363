"""Commits read from `git log`, and a merged pull request read as one change.

Many projects merge pull requests with merge commits (GitHub's "Create a merge commit", GitLab's
default): on the branch's first-parent line there is then one merge per pull request and the
pull request's own commits sit on its second parent. The merge's diff against its first parent is
the pull request's whole change (source and tests), and the state before it is its first parent:
exactly the pair a task needs, as SWE-bench and SWE-rebench take a pull request against its base.
Its statement is what the merge message says beyond its `Merge pull request #N from ...` line (the
pull request's title and description), else the merged commits' own messages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from envforge.sources.gitrepo import git

LOG_FORMAT = "--format=%H%x00%P%x00%an%x00%ae%x00%cI%x00%B%x1e"
# The line GitHub, GitLab, Bitbucket and `git merge` write first; what follows it is the request's own
# words. The statement check cleans the same lines out of every statement (quality/statements.py).
MERGE_LINE = re.compile(
    r"^\s*(?:Merge (?:pull request|branch|branches|remote-tracking branch|tag|commit)\b|Merged in\b).*$", re.I | re.M
)
_MERGE_REQUEST_TRAILER = re.compile(r"^\s*See merge request \S+\s*$", re.I | re.M)  # GitLab
_PULL_REQUEST = re.compile(r"^\s*Merge pull request #(\d+)\b", re.I)


@dataclass(frozen=True)
class Commit:
    sha: str
    parents: tuple[str, ...]
    author: str
    email: str
    committed: str  # ISO 8601
    message: str

    @property
    def is_merge(self) -> bool:
        return len(self.parents) > 1


def log_commits(git_dir: Path, *args: str) -> list[Commit]:
    """`git log` with `args` (options, then revisions), newest first. Raises ValueError on git's error."""
    proc = git(git_dir, "log", LOG_FORMAT, *args, "--")
    if proc.returncode != 0:
        raise ValueError(f"git log {' '.join(args)}: {proc.stderr.decode(errors='replace').strip()[:300]}")
    commits = []
    for record in proc.stdout.decode(errors="replace").split("\x1e"):
        parts = record.strip("\n").split("\x00")
        if len(parts) != 6:
            continue
        sha, parents, author, email, committed, message = parts
        commits.append(Commit(sha, tuple(parents.split()), author, email, committed, message.strip()))
    return commits


def merged_commits(git_dir: Path, merge: Commit, limit: int) -> list[Commit]:
    """The commits a merge brings onto its first parent's line, newest first, at most `limit` + 1 (so
    a caller can tell "more than limit" without reading a release branch's thousands)."""
    return log_commits(git_dir, f"--max-count={limit + 1}", *merge.parents[1:], f"^{merge.parents[0]}")


def pull_request_number(merge: Commit) -> str | None:
    match = _PULL_REQUEST.match(merge.message)
    return match.group(1) if match else None


def merge_statement(merge: Commit, merged: list[Commit]) -> str:
    """What a merged pull request asks for, in its author's words: the merge message without its
    merge line and GitLab's `See merge request` trailer (the title and description GitHub and GitLab
    put there), else the merged commits' messages, oldest first, leaving out the branch's own merges
    (`Merge branch 'main' into fix-x` says nothing about the change)."""
    lines = merge.message.splitlines()
    if lines and MERGE_LINE.match(lines[0]):
        lines = lines[1:]
    own = _MERGE_REQUEST_TRAILER.sub("", "\n".join(lines)).strip()
    if own:
        return own
    words = [c.message for c in reversed(merged) if not c.is_merge and c.message]
    return "\n\n".join(words).strip()


__all__ = ["MERGE_LINE", "Commit", "log_commits", "merge_statement", "merged_commits", "pull_request_number"]
