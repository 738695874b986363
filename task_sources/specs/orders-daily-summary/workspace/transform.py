"""Build the daily revenue summary the finance dashboard reads.

Reads data/orders.csv (an export that may contain the same order more than once) and writes
out/daily_summary.csv with one row per (day, region): day, region, orders, revenue_eur.
"""

import csv
from collections import defaultdict
from pathlib import Path

SRC = Path("data/orders.csv")
DST = Path("out/daily_summary.csv")


def main() -> None:
    totals = defaultdict(lambda: {"orders": 0, "revenue": 0.0})
    with SRC.open(newline="") as fh:
        for row in csv.DictReader(fh):
            day = row["created_at"][:10]
            key = (day, row["region"])
            totals[key]["orders"] += 1
            totals[key]["revenue"] += float(row["amount_eur"])
    DST.parent.mkdir(parents=True, exist_ok=True)
    with DST.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["day", "region", "orders", "revenue_eur"])
        for (day, region), t in totals.items():
            w.writerow([day, region, t["orders"], t["revenue"]])


if __name__ == "__main__":
    main()
