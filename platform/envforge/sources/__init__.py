"""Task sources: parsers that turn what teams already have into `Task`s plus rejects."""

from envforge.sources.result import LoadResult
from envforge.sources.runbooks import load_runbook, load_runbooks
from envforge.sources.specs import discover_spec_files, load_spec_file, load_specs

__all__ = ["LoadResult", "discover_spec_files", "load_spec_file", "load_specs", "load_runbook", "load_runbooks",
           "load_sources"]


def load_sources(paths) -> dict[str, LoadResult]:
    """Every supported source under the paths, by kind: YAML specs (task.yaml) and runbooks (.md)."""
    from pathlib import Path

    paths = [Path(p) for p in paths]
    specs = [p for p in paths if p.is_dir() or not p.exists() or p.suffix in (".yaml", ".yml")]
    runbooks = [p for p in paths if p.is_dir() or p.suffix == ".md"]
    out = {"spec": load_specs(specs) if specs else LoadResult()}
    found = load_runbooks(runbooks) if runbooks else LoadResult()
    if found.tasks or found.rejects:
        out["runbook"] = found
    return out
