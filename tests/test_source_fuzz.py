"""Property-based fuzzing of every source kind: loading never raises and never loses a record.

For each kind, hypothesis writes random records and mutations of a valid record (a field
replaced by any JSON/YAML value, removed, or its text laced with control characters and
odd Unicode) and loads the source as `envforge ingest` does. The properties:
- `load_source` returns (it never raises), and no reject is an `unexpected` exception;
- every record is accounted for: it became a task or candidate, or a reject names it.

CI runs the `ci` profile (a few dozen examples per kind); `ENVFORGE_HYPOTHESIS_PROFILE=thorough`
runs 500 per kind.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envforge.sources import LoadResult, load_source, scan_sources
from envforge.sources.guard import UNEXPECTED
from tests.malformed_sources import GOOD_RUNBOOK, SPEC, Fixture, _review_record, _swe_record, make_fixture

settings.register_profile("ci", max_examples=25, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=500, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("ENVFORGE_HYPOTHESIS_PROFILE", "ci"))

# Text that exercises what parsers trip on: control characters, NUL, surrogate-free odd Unicode, newlines.
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), min_codepoint=0), max_size=40)
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False), TEXT)
VALUE = st.recursive(SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(TEXT, inner, max_size=4)), max_leaves=12)


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> Fixture:
    return make_fixture(tmp_path_factory.mktemp("fuzz-fixture"))


@pytest.fixture(autouse=True)
def confined(monkeypatch):
    monkeypatch.setenv("ENVFORGE_SOURCE_ROOTS", "")


def mutate(draw, record: dict) -> dict:
    """A valid record with one or two fields replaced, removed, or laced with odd text."""
    rec = json.loads(json.dumps(record))
    for _ in range(draw(st.integers(1, 2))):
        key = draw(st.sampled_from(sorted(rec) + ["extra"]))
        how = draw(st.sampled_from(["replace", "drop", "lace"]))
        if how == "drop":
            rec.pop(key, None)
        elif how == "lace" and isinstance(rec.get(key), str):
            rec[key] = rec[key] + draw(TEXT)
        else:
            rec[key] = draw(VALUE)
    return rec


@st.composite
def records(draw, good) -> list:
    """1-3 records: random JSON values, mutated valid records, or raw lines."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["mutated", "mutated", "random", "raw"]))
        if kind == "mutated":
            out.append(mutate(draw, good))
        elif kind == "random":
            out.append(draw(st.dictionaries(TEXT, VALUE, max_size=6)))
        else:
            out.append(draw(st.binary(max_size=60)))
    return out


def _lines(recs: list) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()).replace(b"\n", b" ") + b"\n" for r in recs)


def _load(target: Path) -> LoadResult:
    found = scan_sources([target])
    loaded = LoadResult(rejects=list(found.problems))
    for ref in found.refs:
        loaded.extend(load_source(ref))
    return loaded


def _check(loaded: LoadResult, n_records: int | None = None) -> None:
    assert not [p for p in loaded.rejects if UNEXPECTED in p.reason], loaded.rejects
    for p in loaded.rejects:
        assert p.source and p.reason
    if n_records is not None:
        named = {p.source for p in loaded.rejects if p.record}
        whole = [p for p in loaded.rejects if not p.record]
        # every record is a task/candidate or has a reject naming it (or the whole file was refused, with a reason)
        assert whole or len(loaded.tasks) + len(loaded.candidates) + len(named) >= n_records, (loaded, n_records)


def _blank_lines(recs: list) -> int:
    """Raw lines the loaders skip as blank: JSON's whitespace only, after the BOM line 1 may carry."""
    lines = [r.replace(b"\n", b" ") for r in recs if isinstance(r, bytes)]
    if recs and isinstance(recs[0], bytes):
        lines[0] = lines[0].removeprefix(b"\xef\xbb\xbf")
    return sum(1 for line in lines if not line.strip(b" \t\r"))


def _record_source(fx: Fixture, config: str, records_file: str, recs: list, target: str) -> None:
    """A record file beside its config (naming the fixture's bundle as acme/calc), loaded and checked."""
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        shutil.copy(fx.bundle, d / "calc.bundle")
        (d / config).write_text("repos:\n  acme/calc: calc.bundle\n")
        (d / records_file).write_bytes(_lines(recs))
        _check(_load(d / target), len(recs) - _blank_lines(recs))


@given(data=st.data())
def test_swebench_records_never_crash_or_vanish(fx, data):
    _record_source(fx, "swebench.yaml", "instances.jsonl", data.draw(records(_swe_record(fx))), "instances.jsonl")


@given(data=st.data())
def test_review_records_never_crash_or_vanish(fx, data):
    _record_source(fx, "reviews.yaml", "reviews.jsonl", data.draw(records(_review_record(fx))), "reviews.yaml")


@given(data=st.data())
def test_ticket_exports_never_crash_or_vanish(fx, data):
    good = {"key": "CALC-1", "fields": {"summary": "add() subtracts", "description": "2 + 3 is -1",
                                        "labels": ["math"], "fix_commit": fx.shas["fix"]}}
    recs = data.draw(records(good))
    cells = data.draw(st.lists(st.lists(TEXT, min_size=1, max_size=5), max_size=3))
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        shutil.copy(fx.bundle, d / "calc.bundle")
        (d / "tickets.yaml").write_text("repository: calc.bundle\nproject: calc\nexports:\n  - file: jira.jsonl\n"
                                        "    preset: jira\n  - file: gh.csv\n    preset: github\n")
        (d / "jira.jsonl").write_bytes(_lines(recs))
        import csv
        import io
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(["number", "title", "body", "closed_by_commit"])
        for row in cells:
            writer.writerow(row[:3] + [fx.shas["fix"]])
        (d / "gh.csv").write_bytes(buf.getvalue().encode("utf-8", "surrogatepass"))
        _check(_load(d / "tickets.yaml"))


@given(data=st.data())
def test_specs_never_crash(fx, data):
    spec = yaml.safe_load((SPEC / "task.yaml").read_text())
    if data.draw(st.booleans()):
        text = yaml.safe_dump(mutate(data.draw, spec), allow_unicode=True).encode("utf-8", "surrogatepass")
    else:
        text = data.draw(st.binary(max_size=200))
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "spec"
        shutil.copytree(SPEC, d)
        (d / "task.yaml").write_bytes(text)
        _check(_load(d / "task.yaml"))


@given(data=st.data())
def test_runbooks_never_crash(fx, data):
    _, front, body = GOOD_RUNBOOK.split("---\n", 2)
    meta = yaml.safe_load(front)
    choice = data.draw(st.sampled_from(["front", "body", "bytes"]))
    if choice == "front":
        text = ("---\n" + yaml.safe_dump(mutate(data.draw, meta), allow_unicode=True) + "---\n" + body).encode(
            "utf-8", "surrogatepass")
    elif choice == "body":
        cut = data.draw(st.integers(0, len(body)))
        text = ("---\n" + front + "---\n" + body[:cut] + data.draw(TEXT) + body[cut:]).encode("utf-8", "surrogatepass")
    else:
        text = b"---\n" + data.draw(st.binary(max_size=300))
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "runbooks"
        d.mkdir()
        (d / "rb.md").write_bytes(text)
        _check(_load(d))


@given(data=st.data())
def test_sidecar_configs_never_crash(fx, data):
    """tickets.yaml, reviews.yaml, swebench.yaml and a patch series' repo.yaml, as any YAML value."""
    which = data.draw(st.sampled_from(["tickets.yaml", "reviews.yaml", "swebench.yaml"]))
    value = data.draw(VALUE)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        shutil.copy(fx.bundle, d / "calc.bundle")
        (d / which).write_text(yaml.safe_dump(value, allow_unicode=True), encoding="utf-8", errors="surrogatepass")
        (d / "instances.jsonl").write_text(json.dumps(_swe_record(fx)) + "\n")
        (d / "reviews.jsonl").write_text(json.dumps(_review_record(fx)) + "\n")
        _check(_load(d / ("instances.jsonl" if which == "swebench.yaml" else which)))
