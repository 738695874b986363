"""Run the transformation and check its output against the contract in CONTRACT.md."""

import csv
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

EXPECTED = {  # (day, region) -> (orders, revenue) computed by hand from data/orders.csv
    ("2026-03-01", "EU"): (1, Decimal("120.50")),
    ("2026-03-01", "US"): (1, Decimal("80.00")),
    ("2026-03-02", "APAC"): (1, Decimal("1000.00")),
    ("2026-03-02", "EU"): (1, Decimal("42.00")),
    ("2026-03-02", "US"): (1, Decimal("19.99")),
    ("2026-03-03", "APAC"): (1, Decimal("55.55")),
    ("2026-03-03", "EU"): (1, Decimal("300.00")),
    ("2026-03-03", "US"): (1, Decimal("0.45")),
}

out = Path("out/daily_summary.csv")
out.unlink(missing_ok=True)
proc = subprocess.run([sys.executable, "transform.py"], capture_output=True, text=True, timeout=60)
if proc.returncode != 0:
    print("transform.py failed:", proc.stderr[-500:])
    sys.exit(2)
problems = []
rows = list(csv.reader(out.open(newline="")))
if not rows or rows[0] != ["day", "region", "orders", "revenue_eur"]:
    problems.append(f"header is {rows[0] if rows else None}")
body = rows[1:]
keys = [(r[0], r[1]) for r in body if len(r) == 4]
if keys != sorted(keys):
    problems.append("rows are not sorted by day, region")
got = {}
for r in body:
    if len(r) != 4:
        problems.append(f"row {r} does not have 4 fields")
        continue
    if not re.fullmatch(r"\d+", r[2]):
        problems.append(f"orders {r[2]!r} is not an integer")
    if not re.fullmatch(r"\d+\.\d{2}", r[3]):
        problems.append(f"revenue_eur {r[3]!r} does not have exactly two decimals")
        continue
    got[(r[0], r[1])] = (int(r[2]) if r[2].isdigit() else None, Decimal(r[3]))
if got != EXPECTED:
    for k in sorted(set(got) | set(EXPECTED)):
        if got.get(k) != EXPECTED.get(k):
            problems.append(f"{k}: expected {EXPECTED.get(k)}, got {got.get(k)}")
if problems:
    print("contract violated:\n  " + "\n  ".join(problems[:20]))
    sys.exit(1)
print(f"contract ok: {len(body)} rows")
