"""Reading record files (JSONL, CSV) one record at a time, each with where it came from.

A malformed record is a reject for that record only; the rest of the file still loads. That
holds for a line that is not JSON, a line with an invalid UTF-8 byte, a line over the size
cap, a CSV row with too many values or an unterminated quote. A byte-order mark is accepted.
"""

from __future__ import annotations

import csv
import json
import os
import stat
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from envforge import safefs
from envforge.errors import Problem, SpecError
from envforge.sources.policy import SourcePolicy

T = TypeVar("T")


def _open(path: Path, policy: SourcePolicy):
    """A binary handle on a regular record file under the size cap, or a Problem."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return Problem(str(path), "", f"cannot read file: {exc.strerror or exc}")
    if not stat.S_ISREG(st.st_mode):
        return Problem(str(path), "", f"cannot read file: it is {safefs.kind_of(st.st_mode)}, not a regular file")
    if st.st_size > policy.max_record_file_bytes:
        return Problem(
            str(path),
            "",
            f"the file is {st.st_size} bytes, over the {policy.max_record_file_bytes}-byte "
            "limit (max_record_file_bytes in the source policy)",
        )
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return Problem(str(path), "", f"cannot read file: {exc.strerror or exc}")
    return os.fdopen(fd, "rb")


def _lines(fh, cap: int) -> Iterator[tuple[int, bytes | None]]:
    """(line number, bytes) per physical line; None for a line over cap (its rest is skipped)."""
    n = 0
    while True:
        line = fh.readline(cap + 1)
        if not line:
            return
        n += 1
        if len(line) > cap and not line.endswith(b"\n"):
            while True:  # skip the rest of the oversized line
                rest = fh.readline(1 << 20)
                if not rest or rest.endswith(b"\n"):
                    break
            yield n, None
            continue
        if n == 1 and line.startswith(b"\xef\xbb\xbf"):
            line = line[3:]
        yield n, line


def _jsonl(path: Path, fh, policy: SourcePolicy) -> Iterator[tuple[str, dict[str, Any] | Problem]]:
    for n, raw in _lines(fh, policy.max_record_bytes):
        where = f"{path}:{n}"
        if raw is None:
            yield where, Problem(where, "", f"the line is over the {policy.max_record_bytes}-byte limit")
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield where, Problem(where, "", f"not valid UTF-8 (byte {exc.start} of the line: {exc.reason})")
            continue
        if not line.strip(" \t\r\n"):  # JSON's whitespace only: a line of other control characters
            continue  # (str.strip() takes \x1c-\x1f too) is a reject, not a gap
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError) as exc:
            yield where, Problem(where, "", f"not a JSON record: {exc}")
            continue
        if not isinstance(rec, dict):
            yield where, Problem(where, "", "not a JSON object")
            continue
        yield where, rec


def _csv(path: Path, fh, policy: SourcePolicy) -> Iterator[tuple[str, dict[str, Any] | Problem]]:
    too_long: set[int] = set()

    def text_lines() -> Iterator[str]:
        for n, raw in _lines(fh, policy.max_record_bytes):
            if raw is None:
                too_long.add(n)
                yield "\n"
                continue
            # Invalid bytes survive as surrogates so the row that holds them can be rejected alone.
            yield raw.decode("utf-8", errors="surrogateescape")

    csv.field_size_limit(max(csv.field_size_limit(), policy.max_record_bytes))
    reader = csv.DictReader(text_lines())
    n = 0
    while True:
        first_line = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            n += 1
            where = f"{path}:row {n}"
            yield where, Problem(where, "", f"not a CSV row: {exc}")
            continue
        n += 1
        where = f"{path}:row {n}"
        if any(first_line <= ln <= reader.line_num for ln in too_long):
            yield where, Problem(where, "", f"a line of the row is over the {policy.max_record_bytes}-byte limit")
            continue
        if None in row:
            yield (
                where,
                Problem(where, "", f"row has more values than the header has columns ({len(reader.fieldnames or [])})"),
            )
            continue
        bad = next((k for k, v in row.items() if _has_surrogates(k) or _has_surrogates(v)), None)
        if bad is not None:
            yield where, Problem(where, "" if _has_surrogates(bad) else bad, "not valid UTF-8")
            continue
        yield where, {k: v for k, v in row.items() if k is not None}


def _has_surrogates(value: Any) -> bool:
    if isinstance(value, list):
        return any(_has_surrogates(v) for v in value)
    return isinstance(value, str) and any("\udc80" <= ch <= "\udcff" for ch in value)


def iter_records(
    path: Path, fmt: str | None = None, policy: SourcePolicy | None = None
) -> Iterator[tuple[str, dict[str, Any] | Problem]]:
    """(where, record) per record, or (where, Problem) for one that cannot be read.

    `where` is `file:line` for JSONL and `file:row N` (N counted from the header) for CSV.
    """
    policy = policy or SourcePolicy.from_env()
    fmt = fmt or ("csv" if path.suffix.lower() == ".csv" else "jsonl")
    opened = _open(path, policy)
    if isinstance(opened, Problem):
        yield str(path), opened
        return
    with opened as fh:
        yield from (_csv if fmt == "csv" else _jsonl)(path, fh, policy)


def built_records(
    path: Path, fmt: str | None, policy: SourcePolicy, rejects: list[Problem], build: Callable[[dict[str, Any], str], T]
) -> Iterator[T]:
    """What `build(record, where)` makes of each record; a record that cannot be read or built is a
    reject in `rejects` (an unanticipated exception included) and the rest go on."""
    from envforge.sources.guard import unexpected

    for where, rec in iter_records(path, fmt, policy):
        if isinstance(rec, Problem):
            rejects.append(rec)
            continue
        try:
            item = build(rec, where)
        except SpecError as exc:
            rejects.extend(exc.problems)
            continue
        except Exception as exc:  # noqa: BLE001 - one record is lost, never the batch
            rejects.append(unexpected(where, exc))
            continue
        yield item


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
