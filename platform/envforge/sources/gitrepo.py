"""Local git repositories as task sources: paths, bundles and patch series.

Sources that point at history (SWE-bench instances, tickets with fix commits, review
records) name a repository three ways: a git directory, a `.bundle` file, or a *patch
series* directory (`patches/*.patch` from `git format-patch`, plus `repo.yaml` naming the
committer) that is rebuilt with `git am` into the same commits every time. Bundles and
series are materialized once into a cache keyed by their content digest.

Sources run git through `envforge.gitstore.git`, always with the user's and the system's git
configuration switched off so a hook or alias can't change the result.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import Field, ValidationError

from envforge.errors import SpecError
from envforge.gitstore import GIT_ENV, git
from envforge.sources.fields import StrictModel
from envforge.sources.test_support import test_support_files
from envforge.verify.protect import TEST_GLOBS, matches, split_diff

REPO_CACHE = Path(tempfile.gettempdir()) / "envforge-repos"
# Files that belong to the test change of a fix: held back from the policy, applied at grading.
TEST_CHANGE_GLOBS = TEST_GLOBS + ["**/conftest.py"]


def _stderr(proc: subprocess.CompletedProcess) -> str:
    return proc.stderr.decode(errors="replace").strip()


class Committer(StrictModel):
    name: str = Field("envforge", min_length=1, max_length=200)
    email: str = Field("envforge@localhost", min_length=1, max_length=200)


class SeriesConfig(StrictModel):
    """`repo.yaml` of a patch-series project: who commits and on which branch (fixed, so SHAs are)."""

    committer: Committer = Field(default_factory=Committer)
    branch: str = Field("main", pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,99}$")

    @classmethod
    def load(cls, project: Path) -> "SeriesConfig":
        """The project's repo.yaml (defaults without one); ValueError naming the file and field."""
        from envforge.sources import guard
        from envforge.sources.policy import SourcePolicy

        path = project / "repo.yaml"
        if not path.exists():
            return cls()
        try:
            data = guard.load_yaml_file(path, str(path), SourcePolicy.from_env()) or {}
        except SpecError as exc:
            raise ValueError(str(exc)) from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: must be a YAML mapping (committer.name, committer.email, branch)")
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            fields = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
            raise ValueError(f"{path}: {fields} (allowed: committer.name, committer.email, branch)") from None


def is_patch_series(path: Path) -> bool:
    return path.is_dir() and (path / "patches").is_dir() and any((path / "patches").glob("*.patch"))


def series_digest(project: Path) -> str:
    h = hashlib.sha256()
    for f in [project / "repo.yaml", *sorted((project / "patches").glob("*.patch"))]:
        if f.exists():
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def build_patch_series(project: Path, target: Path) -> Path:
    """Rebuild a patch-series project's repository at target (a fresh directory); returns it.

    The committer identity comes from repo.yaml and committer dates equal author dates, so
    the same patches always give the same commit SHAs.
    """
    project, target = Path(project), Path(target)
    cfg = SeriesConfig.load(project)
    patches = sorted((project / "patches").glob("*.patch"))
    if not patches:
        raise ValueError(f"{project}: no patches/*.patch to build a repository from")
    if target.exists() and any(target.iterdir()):
        raise ValueError(f"{target} exists and is not empty")
    target.mkdir(parents=True, exist_ok=True)
    init = git(target, "init", "-q", "-b", cfg.branch)
    if init.returncode != 0:
        raise ValueError(f"git init {target}: {_stderr(init)}")
    env = {"GIT_COMMITTER_NAME": cfg.committer.name, "GIT_COMMITTER_EMAIL": cfg.committer.email}
    am = git(
        target,
        "-c",
        "commit.gpgsign=false",
        "am",
        "-q",
        "-k",
        "--keep-cr",
        "--committer-date-is-author-date",
        *[str(p.resolve()) for p in patches],
        env=env,
    )
    if am.returncode != 0:
        raise ValueError(f"{project}: `git am` failed: {_stderr(am)[:400]}")
    return target


def _cached(key: str, make) -> Path:
    target = REPO_CACHE / key
    if not (target / "HEAD").exists() and not (target / ".git" / "HEAD").exists():
        REPO_CACHE.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=REPO_CACHE))
        made = make(tmp / "repo")
        try:
            made.rename(target)
        except OSError:  # another process materialized it first
            pass
    return target


def materialize_repo(path: Path) -> Path:
    """A git directory for a repository path, a .bundle file or a patch-series project."""
    path = Path(path)
    if path.is_file() and path.suffix == ".bundle":

        def clone(dest: Path) -> Path:
            proc = subprocess.run(
                ["git", "clone", "-q", "--bare", "--mirror", str(path), str(dest)],
                capture_output=True,
                env={**os.environ, **GIT_ENV},
            )
            if proc.returncode != 0:
                raise ValueError(f"cannot read bundle {path}: {_stderr(proc)}")
            return dest

        return _cached("bundle-" + hashlib.sha256(path.read_bytes()).hexdigest()[:16], clone)
    if is_patch_series(path):
        return _cached("series-" + series_digest(path), lambda dest: build_patch_series(path, dest))
    return path


def repository_dir(base_dir: str | Path, path: str) -> Path:
    """The git directory of a history task's repository: its path is relative to the task's source
    and may name a bundle or a patch-series project (materialized once, cached); ValueError if not."""
    return materialize_repo((Path(base_dir) / path).resolve())


def resolve_commit(repo: Path, rev: str) -> str | None:
    """The full SHA of a commit-ish, or None when the repository has no such commit."""
    if not rev or rev.startswith("-"):
        return None
    proc = git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    return proc.stdout.decode().strip() if proc.returncode == 0 else None


def tree_footprint(repo: Path, commit: str) -> int:
    """Bytes of tmpfs the tree at commit needs as a sandbox workspace (see safefs.TreeScan.footprint)."""
    from envforge.safefs import PAGE

    proc = git(repo, "ls-tree", "-r", "-t", "-l", "-z", commit)
    total = 0
    for entry in proc.stdout.split(b"\0"):
        if not entry:
            continue
        meta = entry.split(b"\t", 1)[0].split()
        size = meta[3] if len(meta) > 3 else b"-"
        total += 2 * (max(PAGE, -(-int(size) // PAGE) * PAGE) if size.isdigit() else PAGE)
    return total


def first_parent(repo: Path, sha: str) -> str | None:
    return resolve_commit(repo, f"{sha}^")


def is_ancestor(repo: Path, ancestor: str, descendant: str) -> bool:
    return git(repo, "merge-base", "--is-ancestor", ancestor, descendant).returncode == 0


def commit_subject(repo: Path, sha: str) -> str:
    return git(repo, "log", "-1", "--format=%s", sha).stdout.decode(errors="replace").strip()


def patch_applies(repo: Path, commit: str, patch: str) -> str | None:
    """None if the patch applies cleanly to the tree at commit; otherwise git's complaint."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = git(repo, "archive", "--format=tar", commit)
        if archive.returncode != 0:
            return _stderr(archive)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        proc = subprocess.run(
            ["git", "apply", "--check", "-"],
            cwd=tmp,
            input=patch.encode(),
            capture_output=True,
            env={**os.environ, **GIT_ENV},
        )
        return None if proc.returncode == 0 else _stderr(proc)[:300]


@dataclass(frozen=True)
class SplitChange:
    """A change between two commits, split into what a policy must write and what grades it."""

    source_patch: str
    test_patch: str
    source_files: list[str]
    test_files: list[str]
    support_files: list[str] = field(default_factory=list)  # test helpers outside the test folders (test_support.py)


def split_change(repo: Path, old: str, new: str) -> SplitChange:
    """`git diff old new`, split per file into the source change and the test change.

    Test files are the conventional test locations (tests/, test_*.py, *_test.py) and
    conftest.py, and the tests' own helpers elsewhere that only they import (test_support.py); test
    *configuration* (pytest.ini, pyproject.toml ...) stays in the source change, since a fix that
    needs a config change needs the policy to make it.
    """
    proc = git(repo, "diff", "--binary", "--full-index", "--no-renames", old, new)
    if proc.returncode != 0:
        raise ValueError(f"git diff {old[:12]} {new[:12]}: {_stderr(proc)}")
    sections = split_diff(proc.stdout.decode(errors="surrogateescape"))
    by_path = {p for s in sections for p in s.paths if not matches(p, TEST_CHANGE_GLOBS)}  # source, by path alone
    support = test_support_files(repo, old, new, sorted(by_path), TEST_CHANGE_GLOBS)
    source, tests, source_files, test_files = [], [], [], []
    for section in sections:
        is_test = all(matches(p, TEST_CHANGE_GLOBS) or p in support for p in section.paths)
        (tests if is_test else source).append(section.text)
        (test_files if is_test else source_files).extend(section.paths)
    return SplitChange(
        "".join(source), "".join(tests), sorted(set(source_files)), sorted(set(test_files)), list(support)
    )


__all__ = [
    "REPO_CACHE",
    "SplitChange",
    "build_patch_series",
    "commit_subject",
    "first_parent",
    "git",
    "is_ancestor",
    "is_patch_series",
    "materialize_repo",
    "patch_applies",
    "resolve_commit",
    "split_change",
    "tree_footprint",
]
