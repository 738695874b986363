"""The bundled specs and runbooks with their task images: the rollout benchmarks' shared workload.

envforge is imported inside the function, so a script can first put another revision's
platform/ on sys.path (bench/observe_overhead.py's `base` arm).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SOURCES = [REPO / "task_sources" / "specs", REPO / "task_sources" / "runbooks"]


def rollout_items(client: Any, settings: Any) -> list[tuple[Any, str]]:
    """(task, image tag) for every bundled spec and runbook task, images built if missing."""
    from envforge.sandbox.images import build_base_image, build_task_image
    from envforge.sources import load_sources

    base = build_base_image(client, settings).tag
    tasks = [t for r in load_sources(SOURCES).values() for t in r.tasks]
    return [(t, build_task_image(client, t, base, settings).tag) for t in tasks]
