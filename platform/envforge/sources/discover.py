"""Finding sources on disk, one `SourceRef` per source, and loading or fingerprinting each.

A *source* is the unit that is ingested, partitioned in Dagster and watched by the sensor:

| kind     | the file that defines it                                  |
|----------|-----------------------------------------------------------|
| spec     | a `task.yaml` / `*.task.yaml`                             |
| runbook  | a `.md` file that opens with front matter                 |
| swebench | a `.jsonl` beside a `swebench.yaml` (or given directly)   |
| ticket   | a `tickets.yaml` (lists its export files)                 |
| review   | a `reviews.yaml` (its record files sit beside it)         |
| history  | a `history.yaml` (a repository's own commits)             |

A source's fingerprint covers every file it reads, including the repository it points at,
so editing a ticket export or adding a patch to a bundled project re-triggers it.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from envforge import safefs
from envforge.errors import Problem, SpecError
from envforge.hashing import tree_digest
from envforge.sources import guard, history, reviews, tickets
from envforge.sources.gitrepo import git, is_patch_series, series_digest
from envforge.sources.policy import SourcePolicy
from envforge.sources.result import LoadResult
from envforge.sources.runbooks import is_runbook, load_runbook
from envforge.sources.specs import is_spec_file, load_spec_file

KINDS = ("spec", "runbook", "swebench", "ticket", "review", "history")
_HISTORY_CONFIGS = {tickets.CONFIG_NAME: "ticket", reviews.CONFIG_NAME: "review", history.CONFIG_NAME: "history"}


@dataclass(frozen=True, order=True)
class SourceRef:
    kind: str
    path: Path

    def key(self, root: Path | None = None) -> str:
        """Stable name: the path relative to the task-sources root (the Dagster partition key)."""
        if root is not None:
            try:
                return self.path.resolve().relative_to(root.resolve()).as_posix()
            except ValueError:
                pass
        return self.path.resolve().as_posix()


@dataclass
class Discovery:
    """What a walk over source paths found: sources, paths that are problems, and files it skipped
    (with the reason) that a user may have meant as sources."""

    refs: list[SourceRef] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    skipped: list[Problem] = field(default_factory=list)


_NOT_A_RUNBOOK = (
    "skipped: a .md file in a runbooks folder that does not open with YAML front matter (a '---' line, "
    "then at least `id:`), so it is not a runbook"
)


def _walk(d: Path, found: Discovery) -> None:
    history_dirs = {f.parent for name in _HISTORY_CONFIGS for f in d.rglob(name)}
    markdown: list[Path] = []
    runbook_dirs: set[Path] = set()
    for f in sorted(d.rglob("*")):
        if not f.is_file() or any(part.startswith(".") for part in f.relative_to(d).parts):
            continue
        if f.suffix in (".yaml", ".yml") and is_spec_file(f):
            found.refs.append(SourceRef("spec", f))
        elif f.name in _HISTORY_CONFIGS:
            found.refs.append(SourceRef(_HISTORY_CONFIGS[f.name], f))
        elif f.suffix == ".md" and is_runbook(f):
            found.refs.append(SourceRef("runbook", f))
            runbook_dirs.add(f.parent)
        elif f.suffix == ".md":
            markdown.append(f)
        elif f.suffix == ".jsonl" and (f.parent / "swebench.yaml").exists() and f.parent not in history_dirs:
            found.refs.append(SourceRef("swebench", f))
    found.skipped += [
        Problem(str(f), "front matter", _NOT_A_RUNBOOK)
        for f in markdown
        if f.parent in runbook_dirs or f.parent.name == "runbooks"
    ]


def scan_sources(paths: Iterable[Path]) -> Discovery:
    """Every source under the paths (files or directories); missing or unknown files are problems."""
    found = Discovery()
    refs, problems = found.refs, found.problems
    for p in (Path(p) for p in paths):
        if p.is_dir():
            _walk(p, found)
        elif not p.exists():
            problems.append(Problem(str(p), "", "no such file or directory"))
        elif p.name in _HISTORY_CONFIGS:
            refs.append(SourceRef(_HISTORY_CONFIGS[p.name], p))
        elif p.suffix == ".jsonl":
            config = next((p.parent / n for n in _HISTORY_CONFIGS if (p.parent / n).exists()), None)
            refs.append(SourceRef(_HISTORY_CONFIGS[config.name], config) if config else SourceRef("swebench", p))
        elif p.suffix == ".md":
            refs.append(SourceRef("runbook", p))
        elif p.suffix in (".yaml", ".yml"):
            refs.append(SourceRef("spec", p))
        else:
            problems.append(
                Problem(
                    str(p),
                    "",
                    "not a known source: expected a task.yaml, a runbook .md, a .jsonl "
                    "of SWE-bench instances, a tickets.yaml, a reviews.yaml or a "
                    "history.yaml",
                )
            )
    found.refs = sorted(set(refs), key=lambda r: (KINDS.index(r.kind), str(r.path)))
    return found


def discover_sources(paths: Iterable[Path]) -> tuple[list[SourceRef], list[Problem]]:
    """(sources, path problems) under the paths: `scan_sources` without the skipped files."""
    found = scan_sources(paths)
    return found.refs, found.problems


def _single(loader: Callable[[Path], object]) -> Callable[[Path], LoadResult]:
    def load(path: Path) -> LoadResult:
        result = LoadResult()
        try:
            result.tasks.append(loader(path))
        except SpecError as exc:
            result.rejects.extend(exc.problems)
        return result

    return load


def _swebench(path: Path) -> LoadResult:
    from envforge.sources.swebench import load_swebench

    return load_swebench([path])


LOADERS: dict[str, Callable[[Path], LoadResult]] = {
    "spec": _single(load_spec_file),
    "runbook": _single(load_runbook),
    "swebench": _swebench,
    "ticket": tickets.load_ticket_source,
    "review": reviews.load_review_source,
    "history": history.load_history_source,
}


def load_source(ref: SourceRef) -> LoadResult:
    """Tasks, candidates and rejects of one source; never raises for bad content: an exception no
    check anticipated becomes a reject naming the source, and the other sources still load."""
    try:
        return LOADERS[ref.kind](ref.path)
    except Exception as exc:  # noqa: BLE001 - one source is lost, never the batch
        return LoadResult(rejects=[guard.unexpected(str(ref.path), exc)])


def _file_digest(path: Path) -> bytes:
    """sha256 of a regular file, streamed; a marker for anything else (never opens a FIFO or a device)."""
    try:
        st = os.stat(path)
    except OSError:
        return b"<missing>"
    if not stat.S_ISREG(st.st_mode):
        return f"<{safefs.kind_of(st.st_mode)}>".encode()
    h = hashlib.sha256()
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest().encode()


def _repo_fingerprint(path: Path) -> str:
    if is_patch_series(path):
        return "series:" + series_digest(path)
    if path.is_file():
        return "file:" + _file_digest(path).decode()
    refs = git(path, "show-ref", "--head")
    return "git:" + hashlib.sha256(refs.stdout).hexdigest() if refs.returncode == 0 else "missing"


def _history_inputs(ref: SourceRef, policy: SourcePolicy) -> tuple[list[Path], list[Path]]:
    """(files, repositories) a ticket/review/swebench source reads, from its config (best effort:
    paths that are not strings or leave the allowed folders are left out, as loading refuses them)."""
    config = ref.path if ref.kind != "swebench" else ref.path.with_name("swebench.yaml")
    try:
        data = guard.load_yaml_file(config, str(config), policy) or {}
    except SpecError:
        return [config], []
    if not isinstance(data, dict):
        return [config], []
    base = config.parent
    repos = [data["repository"]] if isinstance(data.get("repository"), str) else []
    if isinstance(data.get("repos"), dict):
        repos += [v for v in data["repos"].values() if isinstance(v, str)]
    names: list = []
    if ref.kind == "ticket" and isinstance(data.get("exports"), list):
        names = [e.get("file") for e in data["exports"] if isinstance(e, dict)]
    elif ref.kind == "history" and isinstance(data.get("issues"), list):
        names = [e.get("file") for e in data["issues"] if isinstance(e, dict)]
    elif ref.kind == "review":
        names = data["files"] if isinstance(data.get("files"), list) else sorted(f.name for f in base.glob("*.jsonl"))

    def inside(rel: object) -> Path | None:
        try:
            return safefs.confine(base, rel, policy.roots) if isinstance(rel, str) else None
        except safefs.UnsafePath:
            return None

    files = [config, *filter(None, map(inside, names))]
    return files, list(filter(None, map(inside, repos)))


def fingerprint(ref: SourceRef, policy: SourcePolicy | None = None) -> str:
    """Digest of everything the source reads; changes exactly when re-ingesting could change the result."""
    policy = policy or SourcePolicy.from_env()
    h = hashlib.sha256(f"{ref.kind}\0".encode())
    if ref.kind == "spec":
        h.update(tree_digest(ref.path.parent).encode())
    else:
        files, repos = ([ref.path], []) if ref.kind == "runbook" else _history_inputs(ref, policy)
        if ref.kind == "swebench":
            files = [ref.path, *files]
        for f in files:
            h.update(str(f).encode() + b"\0" + _file_digest(f) + b"\0")
        for r in repos:
            h.update(_repo_fingerprint(r).encode())
    return h.hexdigest()[:32]
