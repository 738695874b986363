"""Reading record files (JSONL, CSV) one record at a time, each with where it came from.

A malformed line is a reject for that line only; the rest of the file still loads.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Iterator

from envforge.errors import Problem


def iter_records(path: Path, fmt: str | None = None) -> Iterator[tuple[str, dict[str, Any] | Problem]]:
    """(where, record) per record, or (where, Problem) for one that cannot be read.

    `where` is `file:line` for JSONL and `file:row N` (N counted from the header) for CSV.
    """
    fmt = fmt or ("csv" if path.suffix.lower() == ".csv" else "jsonl")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        yield str(path), Problem(str(path), "", f"cannot read file: {exc}")
        return
    if fmt == "csv":
        reader = csv.DictReader(text.splitlines(keepends=True))
        for n, row in enumerate(reader, start=1):
            where = f"{path}:row {n}"
            if None in row:
                yield where, Problem(where, "", f"row has more values than the header has columns ({len(reader.fieldnames or [])})")
                continue
            yield where, {k: v for k, v in row.items() if k is not None}
        return
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            rec = json.loads(line)
        except ValueError as exc:
            yield where, Problem(where, "", f"not a JSON record: {exc}")
            continue
        if not isinstance(rec, dict):
            yield where, Problem(where, "", "not a JSON object")
            continue
        yield where, rec


def get_path(record: dict[str, Any], dotted: str) -> Any:
    """record['a']['b'] for 'a.b'; a key that itself contains dots (CSV headers) is tried first."""
    if dotted in record:
        return record[dotted]
    value: Any = record
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip()) or value == [] or value == {}
