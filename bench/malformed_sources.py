"""Tally the malformed-source case set: rejected with a reason, crashes, hangs, wrong accepts.

    .venv/bin/python bench/malformed_sources.py [--cases] [--out FILE]

Builds every case of tests/malformed_sources.py (hostile and malformed records of the five
source kinds) in a temporary folder, loads each the way `envforge ingest` does, and prints one
JSON document: the counts, and with --cases one line per case (status and the reject it got).
Also times loading the case set once (median of 3), so a slow guard shows up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "platform"))
sys.path.insert(0, str(REPO))

from tests.malformed_sources import run_cases, tally  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", action="store_true", help="include every case's outcome")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    times, outcomes = [], []
    for _ in range(3):
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            outcomes = run_cases(Path(tmp))
            times.append(time.perf_counter() - started)
            for o in outcomes:
                o.detail = o.detail.replace(tmp, "")
    doc = {**tally(outcomes), "seconds_median": round(statistics.median(times), 2)}
    if args.cases:
        doc["case_outcomes"] = [{"case": o.case, "kind": o.kind, "status": o.status, "detail": o.detail[:300]}
                                for o in outcomes]
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
