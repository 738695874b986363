"""Where a stage's sandboxes run: on this process's engine (the default) or on the fleet.

`ENVFORGE_RAY_ADDRESS` set means the fleet: the stage's sandbox work (rollout episodes, grading,
gate runs) goes to the Ray cluster there, while images are still built on the stage's own
engine (`DOCKER_HOST`), which the nodes receive base images from and build task layers like.
Unset, nothing here imports Ray and the single-machine path runs as before.
"""

from __future__ import annotations

import os
import threading
from typing import Mapping

from envforge.fleet.config import ADDRESS_ENV, FleetConfig
from envforge.fleet.dispatcher import FleetDispatcher

_lock = threading.Lock()
_dispatcher: FleetDispatcher | None = None


def fleet_enabled(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return bool((env.get(ADDRESS_ENV) or "").strip())


def dispatcher_from_env(environ: Mapping[str, str] | None = None) -> FleetDispatcher | None:
    """The process's dispatcher when the fleet is configured (started once, checked at start), else None."""
    global _dispatcher
    if not fleet_enabled(environ):
        return None
    with _lock:
        if _dispatcher is None:
            _dispatcher = FleetDispatcher(FleetConfig.from_env(environ)).start()
        return _dispatcher
