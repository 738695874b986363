"""What changed under the task-source roots since the last look: the sensor's logic, kept
free of Dagster so the CLI, the nightly refresh and tests can use it too.

State is a JSON-able map {source key: fingerprint}. A source is *new* when its key was not
seen, *changed* when its fingerprint differs, *removed* when it is no longer discovered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from envforge.sources.discover import SourceRef, discover_sources, fingerprint


@dataclass
class SourceChanges:
    new: list[SourceRef] = field(default_factory=list)
    changed: list[SourceRef] = field(default_factory=list)
    removed: list[tuple[str, str]] = field(default_factory=list)  # (kind, key)
    state: dict[str, dict[str, str]] = field(default_factory=dict)  # key -> {kind, fingerprint}

    @property
    def to_ingest(self) -> list[SourceRef]:
        return self.new + self.changed

    def __bool__(self) -> bool:
        return bool(self.new or self.changed or self.removed)


def scan(roots: Iterable[Path], root: Path, previous: dict[str, dict[str, str]] | None = None) -> SourceChanges:
    """Compare the sources under roots with the previous state; keys are relative to root."""
    previous = previous or {}
    refs, _ = discover_sources(roots)
    out = SourceChanges()
    for ref in refs:
        key = ref.key(root)
        fp = fingerprint(ref)
        out.state[key] = {"kind": ref.kind, "fingerprint": fp}
        before = previous.get(key)
        if before is None:
            out.new.append(ref)
        elif before.get("fingerprint") != fp:
            out.changed.append(ref)
    out.removed = sorted((v.get("kind", ""), k) for k, v in previous.items() if k not in out.state)
    return out
