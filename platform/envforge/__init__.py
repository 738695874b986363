"""envforge: turn enterprise workflows into executable, verifiable RL environments.

The library is organised by pipeline stage (sources, sandbox, verify, quality, rollout,
train); `envforge.cli` and the Dagster code location in `assets/` are thin callers.
"""

__version__ = "0.1.0"
