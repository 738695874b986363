"""mypy with a baseline that only shrinks: the errors per module may not grow, and when a module
loses errors the baseline must be lowered to match, so they cannot come back unnoticed.

    python tools/mypy_baseline.py            # check (what `make lint` runs); exit 1 on any change
    python tools/mypy_baseline.py --update   # write the current counts to tools/mypy-baseline.json

mypy reads its settings from pyproject.toml ([tool.mypy]: the files, the libraries read as Any).
Lowering the baseline is `--update` after fixing; raising it is the same command, and shows in the
diff of tools/mypy-baseline.json for a reviewer to refuse.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASELINE = REPO / "tools" / "mypy-baseline.json"
# platform/envforge/rollout/batch.py:17: error: Incompatible ... [arg-type]
_ERROR = re.compile(r"^(?P<path>[^:\s]+\.py):\d+(?::\d+)?: error: ")


def count_errors(output: str) -> tuple[Counter[str], dict[str, list[str]]]:
    """mypy's output -> (errors per module file, the error lines of each file)."""
    counts: Counter[str] = Counter()
    lines: dict[str, list[str]] = {}
    for line in output.splitlines():
        match = _ERROR.match(line)
        if match:
            counts[match["path"]] += 1
            lines.setdefault(match["path"], []).append(line)
    return counts, lines


def compare(
    current: Counter[str], baseline: dict[str, int]
) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]]:
    """(files with more errors than the baseline, files with fewer): path -> (baseline, now)."""
    grown, shrunk = {}, {}
    for path in sorted(set(current) | set(baseline)):
        before, now = baseline.get(path, 0), current.get(path, 0)
        if now > before:
            grown[path] = (before, now)
        elif now < before:
            shrunk[path] = (before, now)
    return grown, shrunk


def run_mypy() -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--no-pretty"], cwd=REPO, capture_output=True, text=True
    )
    found = any(_ERROR.match(line) for line in proc.stdout.splitlines())
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not found):
        raise SystemExit(f"mypy failed to run (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--update", action="store_true", help="write the current counts as the baseline")
    args = parser.parse_args(argv)
    counts, lines = count_errors(run_mypy())
    if args.update:
        BASELINE.write_text(json.dumps(dict(sorted(counts.items())), indent=1) + "\n")
        print(f"{BASELINE.relative_to(REPO)}: {sum(counts.values())} errors in {len(counts)} files")
        return 0
    baseline = json.loads(BASELINE.read_text())
    grown, shrunk = compare(counts, baseline)
    for path, (before, now) in grown.items():
        print(f"{path}: {now} mypy errors, the baseline allows {before}:")
        print("\n".join(f"  {line}" for line in lines[path]))
    for path, (before, now) in shrunk.items():
        print(
            f"{path}: {now} mypy errors, down from {before}: lower the baseline (python tools/mypy_baseline.py --update)"
        )
    if grown or shrunk:
        return 1
    print(f"mypy: {sum(counts.values())} errors in {len(counts)} files, as in {BASELINE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
