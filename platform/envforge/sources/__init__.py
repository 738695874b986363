"""Task sources: parsers that turn what teams already have into `Task`s plus rejects.

Specs, runbooks and SWE-bench instances become tasks directly; tickets and review records
become `Candidate`s whose tests are derived by running them (`envforge.sources.derive`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from envforge.sources.discover import (
    KINDS,
    Discovery,
    SourceRef,
    discover_sources,
    fingerprint,
    load_source,
    scan_sources,
)
from envforge.sources.result import LoadResult
from envforge.sources.runbooks import load_runbook, load_runbooks
from envforge.sources.specs import discover_spec_files, load_spec_file, load_specs

__all__ = [
    "KINDS",
    "Discovery",
    "LoadResult",
    "SourceRef",
    "discover_sources",
    "discover_spec_files",
    "fingerprint",
    "load_by_source",
    "load_runbook",
    "load_runbooks",
    "load_source",
    "load_sources",
    "load_spec_file",
    "load_specs",
    "scan_sources",
]


def load_by_source(
    paths: Iterable[Path], discovery: Discovery | None = None
) -> tuple[list[tuple[SourceRef, LoadResult]], list]:
    """Each discovered source with its result (task ids unique across all of them), plus path problems."""
    discovery = discovery or scan_sources(paths)
    refs, problems = discovery.refs, discovery.problems
    seen: dict[str, str] = {}
    loaded = []
    for ref in refs:
        raw = load_source(ref)
        res = LoadResult(rejects=list(raw.rejects), skipped=list(raw.skipped), cursor=raw.cursor)
        for task in raw.tasks:
            res.add_unique(task, seen)
        for cand in raw.candidates:
            res.add_unique_candidate(cand, seen)
        loaded.append((ref, res))
    return loaded, problems


def load_sources(paths: Iterable[Path]) -> dict[str, LoadResult]:
    """Every source under the paths, merged by kind ('spec' always present; path problems go there)."""
    loaded, problems = load_by_source(paths)
    out: dict[str, LoadResult] = {"spec": LoadResult(rejects=list(problems))}
    for ref, res in loaded:
        out.setdefault(ref.kind, LoadResult()).extend(res)
    return out
