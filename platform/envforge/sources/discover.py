"""Finding sources on disk, one `SourceRef` per source, and loading or fingerprinting each.

A *source* is the unit that is ingested, partitioned in Dagster and watched by the sensor:

| kind     | the file that defines it                                  |
|----------|-----------------------------------------------------------|
| spec     | a `task.yaml` / `*.task.yaml`                             |
| runbook  | a `.md` file that opens with front matter                 |
| swebench | a `.jsonl` beside a `swebench.yaml` (or given directly)   |
| ticket   | a `tickets.yaml` (lists its export files)                 |
| review   | a `reviews.yaml` (its record files sit beside it)         |

A source's fingerprint covers every file it reads, including the repository it points at,
so editing a ticket export or adding a patch to a bundled project re-triggers it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import yaml

from envforge.errors import Problem
from envforge.hashing import tree_digest
from envforge.sources import reviews, tickets
from envforge.sources.gitrepo import git, is_patch_series, series_digest
from envforge.sources.result import LoadResult
from envforge.sources.runbooks import is_runbook, load_runbook
from envforge.sources.specs import is_spec_file, load_spec_file

KINDS = ("spec", "runbook", "swebench", "ticket", "review")
_HISTORY_CONFIGS = {tickets.CONFIG_NAME: "ticket", reviews.CONFIG_NAME: "review"}


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


def _walk(d: Path) -> list[SourceRef]:
    refs: list[SourceRef] = []
    history_dirs = {f.parent for name in _HISTORY_CONFIGS for f in d.rglob(name)}
    for f in sorted(d.rglob("*")):
        if not f.is_file() or any(part.startswith(".") for part in f.relative_to(d).parts):
            continue
        if f.suffix in (".yaml", ".yml") and is_spec_file(f):
            refs.append(SourceRef("spec", f))
        elif f.name in _HISTORY_CONFIGS:
            refs.append(SourceRef(_HISTORY_CONFIGS[f.name], f))
        elif f.suffix == ".md" and is_runbook(f):
            refs.append(SourceRef("runbook", f))
        elif f.suffix == ".jsonl" and (f.parent / "swebench.yaml").exists() and f.parent not in history_dirs:
            refs.append(SourceRef("swebench", f))
    return refs


def discover_sources(paths: Iterable[Path]) -> tuple[list[SourceRef], list[Problem]]:
    """Every source under the paths (files or directories); missing or unknown files are problems."""
    refs: list[SourceRef] = []
    problems: list[Problem] = []
    for p in (Path(p) for p in paths):
        if p.is_dir():
            refs.extend(_walk(p))
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
            problems.append(Problem(str(p), "", "not a known source: expected a task.yaml, a runbook .md, a .jsonl "
                                                "of SWE-bench instances, a tickets.yaml or a reviews.yaml"))
    unique = sorted(set(refs), key=lambda r: (KINDS.index(r.kind), str(r.path)))
    return unique, problems


def _single(loader: Callable[[Path], object]) -> Callable[[Path], LoadResult]:
    from envforge.errors import SpecError

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
    "spec": _single(load_spec_file), "runbook": _single(load_runbook), "swebench": _swebench,
    "ticket": tickets.load_ticket_source, "review": reviews.load_review_source,
}


def load_source(ref: SourceRef) -> LoadResult:
    """Tasks, candidates and rejects of one source; never raises for bad content."""
    return LOADERS[ref.kind](ref.path)


def _repo_fingerprint(path: Path) -> str:
    if is_patch_series(path):
        return "series:" + series_digest(path)
    if path.is_file():
        return "file:" + hashlib.sha256(path.read_bytes()).hexdigest()
    refs = git(path, "show-ref", "--head")
    return "git:" + hashlib.sha256(refs.stdout).hexdigest() if refs.returncode == 0 else "missing"


def _history_inputs(ref: SourceRef) -> tuple[list[Path], list[Path]]:
    """(files, repositories) a ticket/review/swebench source reads, from its config (best effort)."""
    config = ref.path if ref.kind != "swebench" else ref.path.with_name("swebench.yaml")
    try:
        data = yaml.safe_load(config.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return [], []
    if not isinstance(data, dict):
        return [], []
    base = config.parent
    repos = [data["repository"]] if isinstance(data.get("repository"), str) else []
    if isinstance(data.get("repos"), dict):
        repos += [v for v in data["repos"].values() if isinstance(v, str)]
    files: list[Path] = [config]
    if ref.kind == "ticket":
        files += [base / e["file"] for e in data.get("exports") or [] if isinstance(e, dict) and "file" in e]
    elif ref.kind == "review":
        files += [base / f for f in data["files"]] if isinstance(data.get("files"), list) \
            else sorted(base.glob("*.jsonl"))
    return files, [(base / r).resolve() for r in repos]


def fingerprint(ref: SourceRef) -> str:
    """Digest of everything the source reads; changes exactly when re-ingesting could change the result."""
    h = hashlib.sha256(f"{ref.kind}\0".encode())
    if ref.kind == "spec":
        h.update(tree_digest(ref.path.parent).encode())
    else:
        files, repos = ([ref.path], []) if ref.kind == "runbook" else _history_inputs(ref)
        if ref.kind == "swebench":
            files = [ref.path, *files]
        for f in files:
            h.update(str(f).encode() + b"\0" + (f.read_bytes() if f.is_file() else b"<missing>") + b"\0")
        for r in repos:
            h.update(_repo_fingerprint(r).encode())
    return h.hexdigest()[:32]
