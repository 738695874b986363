"""envforge's own copy of the commits its history tasks are built from, addressed by SHA.

A task mined from history is a commit of someone's repository. Pointing at that repository by
absolute path ties the task to one machine and one folder; instead, ingest copies the commit
(its tree only, `--depth 1`) into a bare repository under the data directory, and image
builds read the workspace from there. A stored task therefore refers to its workspace by
content digest (the commit SHA) and to its repository only relative to its source, so it still
builds after the source folder moves, and two tasks of one repository share every object.
"""

from __future__ import annotations

import fcntl
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from envforge.sources.gitrepo import git

_LOCK = threading.Lock()


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
            raise ValueError(f"cannot copy commit {sha[:12]} into the repository store: "
                             f"{proc.stderr.decode(errors='replace').strip()[:300]}")


def commit_dir(data_dir: Path, sha: str, repository: Callable[[], Path]) -> Path:
    """The git directory to read commit `sha` from: the store when it holds the commit (the source
    may have moved since ingest), else the source's repository (`repository()`, resolved only then)."""
    return store_dir(data_dir) if has_commit(data_dir, sha) else repository()


__all__ = ["commit_dir", "has_commit", "keep_commit", "store_dir"]
