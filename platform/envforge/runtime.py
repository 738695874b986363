"""What a process runs on, decided once: where its sandboxes come from.

The entry points (the CLI, the Dagster assets' stage context, the environment service, the
demos) call `sandbox_provider()` and hand the provider down (`StageContext.sandboxes`); the
domain layers take whatever they are handed and never look at the environment. With
`ENVFORGE_RAY_ADDRESS` set the sandboxes run on the fleet (docs/fleet.md; the cluster is joined at
the first unit of work, or at `provider.start()`); unset, on this process's engine, and
nothing imports Ray. This is the one module outside `envforge.fleet` that imports it.
"""

from __future__ import annotations

import os
from typing import Mapping

from envforge.sandbox.provider import LocalSandboxProvider, SandboxProvider

ADDRESS_ENV = "ENVFORGE_RAY_ADDRESS"  # as envforge.fleet.config.ADDRESS_ENV, read without importing the fleet


def sandbox_provider(environ: Mapping[str, str] | None = None) -> SandboxProvider:
    """The fleet when `ENVFORGE_RAY_ADDRESS` is set, else the local engine's warm pools."""
    env = os.environ if environ is None else environ
    if (env.get(ADDRESS_ENV) or "").strip():
        from envforge.fleet.provider import FleetSandboxProvider

        return FleetSandboxProvider(environ=environ)
    return LocalSandboxProvider()
