"""envforge's own copy of the commits its history tasks are built from, addressed by SHA.

A task mined from history is a commit of someone's repository. Pointing at that repository by
absolute path ties the task to one machine and one folder; instead, ingest copies the commit
(its tree only, `--depth 1`) into a bare repository under the data directory, and image
builds read the workspace from there. A stored task therefore refers to its workspace by
content digest (the commit SHA) and to its repository only relative to its source, so it still
builds after the source folder moves, and two tasks of one repository share every object.

Below both the sources (which keep commits at ingest) and the sandbox (which builds a task's
image from the store), with `git`: git on this machine with the user's and the system's
configuration switched off.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

# git with the user's and the system's configuration switched off, so a hook or alias can't change a result.
GIT_ENV = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
_LOCK = threading.Lock()


def git(
    repo: Path, *args: str, input: bytes | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """git -C repo ARGS with a neutral configuration; never raises on a non-zero exit."""
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, input=input, env={**os.environ, **GIT_ENV, **(env or {})}
    )


def file_text(repo: Path, commit: str, path: str) -> str | None:
    """A file's text in the tree at `commit` (undecodable bytes replaced), None when it is not there."""
    proc = git(repo, "show", f"{commit}:{path}")
    return proc.stdout.decode(errors="replace") if proc.returncode == 0 else None


def store_dir(data_dir: Path) -> Path:
    return data_dir / "repos" / "store.git"


@contextmanager
def _locked(store: Path) -> Iterator[None]:
    """One writer at a time, across threads and processes (git's shallow file is not shared-safe)."""
    with _LOCK:
        store.parent.mkdir(parents=True, exist_ok=True)
        with open(store.parent / "store.lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


def has_commit(data_dir: Path, sha: str) -> bool:
    store = store_dir(data_dir)
    return (store / "HEAD").exists() and git(store, "cat-file", "-e", f"{sha}^{{commit}}").returncode == 0


def keep_commit(data_dir: Path, git_dir: Path, sha: str) -> None:
    """Copy one commit's tree from a repository into the store (a no-op when it is there)."""
    if has_commit(data_dir, sha):
        return
    store = store_dir(data_dir)
    with _locked(store):
        if not (store / "HEAD").exists():
            init = git(store.parent, "init", "-q", "--bare", store.name)
            if init.returncode != 0:
                raise ValueError(f"cannot create the repository store {store}: {init.stderr.decode(errors='replace')}")
        if has_commit(data_dir, sha):
            return
        proc = git(store, "fetch", "-q", "--depth=1", "--no-tags", str(git_dir), f"{sha}:refs/keep/{sha}")
        if proc.returncode != 0:
            raise ValueError(
                f"cannot copy commit {sha[:12]} into the repository store: "
                f"{proc.stderr.decode(errors='replace').strip()[:300]}"
            )


def commit_dir(data_dir: Path, sha: str, repository: Callable[[], Path]) -> Path:
    """The git directory to read commit `sha` from: the store when it holds the commit (the source
    may have moved since ingest), else the source's repository (`repository()`, resolved only then)."""
    return store_dir(data_dir) if has_commit(data_dir, sha) else repository()


__all__ = ["GIT_ENV", "commit_dir", "git", "has_commit", "keep_commit", "store_dir"]
