"""Where envforge runs from: the default home of its data, sandboxes and task sources.

Below envforge.settings (whose path defaults use it) and envforge.config (which re-exports it).
"""

from __future__ import annotations

from pathlib import Path

# The repository root when envforge runs from a checkout (platform/envforge/checkout.py).
_CHECKOUT_ROOT = Path(__file__).resolve().parents[2]


def checkout_root() -> Path:
    """The repository checkout envforge runs from (or the working directory for an installed package)."""
    return _CHECKOUT_ROOT if (_CHECKOUT_ROOT / "sandboxes").is_dir() else Path.cwd()
