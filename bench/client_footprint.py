"""What a trainer's venv pays for envforge: the thin client package against the full platform.

    .venv/bin/python bench/client_footprint.py [--runs N] [--out FILE]

The client is measured in a venv of its own (built under --client-venv from ./clients/python
if missing; PyPI must be reachable), as a trainer would have it; the full package in the venv
this script runs in. Install size: the installed files of each package's dependency closure
(its `Requires-Dist` without extras, followed recursively through the distributions of its venv),
summed from each distribution's RECORD. Import time: `python -c "import X"` in a fresh
interpreter of each venv, N runs each, alternating (so both see the same load); the medians and
the ratios full/client. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {
    # name: (distribution, what a user imports to talk to the service)
    "client": ("envforge-client", "import envforge_client"),
    "full": ("envforge", "import envforge.service.client"),
}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str | None:
    """The distribution a Requires-Dist line needs unconditionally (None: only under an extra)."""
    if "extra ==" in requirement.replace("extra==", "extra =="):
        return None
    marker = requirement.split(";", 1)[1] if ";" in requirement else ""
    if marker:
        try:
            from packaging.markers import Marker

            if not Marker(marker).evaluate({"extra": ""}):
                return None
        except Exception:  # an unparseable marker: count the dependency (an over-, not an under-estimate)
            pass
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    return _canonical(match.group(1)) if match else None


def closure(distribution: str) -> dict[str, int]:
    """Installed bytes per distribution of the dependency closure (this venv's versions)."""
    sizes: dict[str, int] = {}
    todo = [_canonical(distribution)]
    while todo:
        name = todo.pop()
        if name in sizes:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            sizes[name] = 0  # required but not installed here (a platform-specific dependency)
            continue
        total = 0
        for f in dist.files or []:
            try:
                total += f.locate().stat().st_size
            except OSError:
                pass
        sizes[name] = total
        todo.extend(n for r in dist.requires or [] if (n := _requirement_name(r)) is not None)
    return sizes


def import_seconds(python: str, statement: str) -> float:
    started = time.perf_counter()
    subprocess.run([python, "-c", statement], check=True)
    return time.perf_counter() - started


def client_venv(path: Path) -> str:
    """The python of a venv holding only the client package (built once)."""
    python = path / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", str(REPO / "clients" / "python")], check=True)
    return str(python)


def closure_in(python: str, distribution: str) -> dict[str, int]:
    out = subprocess.run([python, __file__, "--closure", distribution], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--client-venv", type=Path, default=Path("/tmp/envforge-client-venv"))
    ap.add_argument("--closure", help=argparse.SUPPRESS)  # internal: print one closure as JSON
    args = ap.parse_args()
    if args.closure:
        print(json.dumps(closure(args.closure)))
        return
    pythons = {"client": client_venv(args.client_venv), "full": sys.executable}
    baseline = [import_seconds(sys.executable, "pass") for _ in range(args.runs)]
    times: dict[str, list[float]] = {k: [] for k in PACKAGES}
    for i in range(args.runs):
        order = list(PACKAGES) if i % 2 == 0 else list(reversed(PACKAGES))
        for key in order:
            times[key].append(import_seconds(pythons[key], PACKAGES[key][1]))
    result: dict = {
        "config": {"runs": args.runs, "python": sys.version.split()[0]},
        "interpreter_start_s": statistics.median(baseline),
    }
    for key, (dist, statement) in PACKAGES.items():
        sizes = closure_in(pythons[key], dist)
        result[key] = {
            "distribution": dist,
            "import": statement,
            "distributions": len(sizes),
            "install_mb": round(sum(sizes.values()) / 2**20, 1),
            "largest": {k: round(v / 2**20, 1) for k, v in sorted(sizes.items(), key=lambda kv: -kv[1])[:5]},
            "import_s_median": round(statistics.median(times[key]), 3),
        }
    result["ratios_full_over_client"] = {
        "install_mb": round(result["full"]["install_mb"] / result["client"]["install_mb"], 1),
        "import_s": round(result["full"]["import_s_median"] / result["client"]["import_s_median"], 1),
    }
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
