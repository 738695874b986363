"""Task sources: parsers that turn what teams already have into `Task`s plus rejects."""

from envforge.sources.result import LoadResult
from envforge.sources.runbooks import load_runbook, load_runbooks
from envforge.sources.specs import discover_spec_files, load_spec_file, load_specs

__all__ = ["LoadResult", "discover_spec_files", "load_spec_file", "load_specs", "load_runbook", "load_runbooks",
           "load_sources"]


def load_sources(paths) -> dict[str, LoadResult]:
    """Every supported source under the paths, by kind: YAML specs (task.yaml), runbooks (.md with
    front matter) and SWE-bench instances (.jsonl given directly or beside a swebench.yaml)."""
    from pathlib import Path

    from envforge.sources.swebench import load_swebench

    paths = [Path(p) for p in paths]
    specs = [p for p in paths if p.is_dir() or not p.exists() or p.suffix in (".yaml", ".yml")]
    runbooks = [p for p in paths if p.is_dir() or p.suffix == ".md"]
    # SWE-bench JSONL: given directly, or found beside a swebench.yaml repository map.
    instances = [p for p in paths if p.suffix == ".jsonl"]
    for d in (p for p in paths if p.is_dir()):
        instances += sorted(f for sidecar in d.rglob("swebench.yaml") for f in sidecar.parent.glob("*.jsonl"))
    out = {"spec": load_specs(specs) if specs else LoadResult()}
    for kind, found in (("runbook", load_runbooks(runbooks) if runbooks else LoadResult()),
                        ("swebench", load_swebench(instances) if instances else LoadResult())):
        if found.tasks or found.rejects:
            out[kind] = found
    return out
