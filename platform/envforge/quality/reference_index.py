"""A persisted index over reference corpora, built once, kept in step with the corpora.

Two candidate generators share one document numbering:
- MinHash LSH over half-overlapping windows of `window_words` words (containment: a task that
  copies part of a long benchmark document has a high Jaccard with the windows it copied);
- the exact n-gram index (`ngram_index.py`) over winnowed word n-grams of each document and,
  for documents holding Python, of its masked prose and normalized code views (`code.py`):
  every shared run of at least the guaranteed length is proposed.
Every candidate is then confirmed exactly by the same rules (`confirm.py`).

On disk (one directory):
  manifest.json   format, index parameters, banding, counts, and per corpus file: its corpus,
                  digest and the range of documents it holds
  bands.npz       the banded LSH arrays over windows (see lsh.BandIndex)
  sigs.npy, windows.npy   window signatures and the document each window belongs to
  ngrams.npz      n-gram postings (see ngram_index.NgramIndex)
  live.npy        which documents are current (a removed or changed file's documents are retired)
  docs-NNNNN.parquet  corpus, doc_id, text of every indexed document, in index order

`sync(corpora)` makes the index hold exactly the given corpora: new files are read, a file
whose content changed is re-read (its old documents are retired), files of corpora no longer
given are retired, unchanged files cost a digest check. When retired documents outnumber
the current ones, the index is compacted (rebuilt from its own stored texts).
"""

from __future__ import annotations

import json
import shutil
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from envforge.quality.code import CodeViews, views_of
from envforge.quality.confirm import Match, Prepared, compare, prepare
from envforge.quality.corpora import CorpusDoc, fingerprint, humaneval, humaneval_digest, read_corpus
from envforge.quality.fingerprint import batch_ngrams, winnow
from envforge.quality.lsh import BandIndex
from envforge.quality.ngram_index import NgramIndex
from envforge.quality.params import DedupConfig, IndexConfig
from envforge.quality.text import window_starts
from envforge.safefs import write_atomic

BATCH = 10_000
HUMANEVAL = "humaneval"
FORMAT = 2
TEXT, PROSE, CODE = 0, 1, 2  # n-gram salts: the views never match each other
_ARRAYS = ("manifest.json", "bands.npz", "sigs.npy", "windows.npy", "ngrams.npz", "live.npy")


@dataclass
class SyncReport:
    added_docs: int = 0
    added_files: list[str] = field(default_factory=list)
    unchanged_files: int = 0
    changed_files: list[str] = field(default_factory=list)  # re-read: their old documents are retired
    removed_files: list[str] = field(default_factory=list)  # no longer in the corpora given: retired
    rejects: list[str] = field(default_factory=list)  # bad corpus records, skipped: "file:line: reason"
    rebuilt: str = ""  # why the index was started afresh, if it was

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class QueryText:
    """A text to search for: `python` True for Python source, None to look for code in it."""

    text: str
    python: bool | None = None


@dataclass(frozen=True)
class Candidate:
    query: int
    corpus: str
    doc_id: str
    est_jaccard: float
    match: Match
    proposed_by: tuple[str, ...] = ()  # lsh, ngram


def _batches(docs: Iterable[CorpusDoc], size: int = BATCH) -> Iterator[list[CorpusDoc]]:
    batch: list[CorpusDoc] = []
    for d in docs:
        batch.append(d)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class IndexMismatch(ValueError):
    """The index on disk was built with other parameters than the ones asked for."""


class ReferenceIndex:
    """`config` None: open with the parameters the index was built with (defaults if new)."""

    def __init__(self, root: Path, config: IndexConfig | None = None):
        self.root = Path(root)
        self.rebuilt = ""
        manifest = self.root / "manifest.json"
        data = json.loads(manifest.read_text()) if manifest.exists() else None
        if data is not None and data.get("format") != FORMAT:
            self.rebuilt = "the index was written by another envforge version"
            self._clear()
            data = None
        if data is not None:
            built = IndexConfig(**data["index"])
            if config is not None and config != built:
                diff = ", ".join(f"{k} {b} (asked: {a})" for k, (a, b) in config.differences(built).items())
                raise IndexMismatch(
                    f"index {self.root} was built with {diff}; rebuild it with these parameters: "
                    f"envforge dedup index --rebuild {config.cli_flags()}".rstrip()
                )
            self.config = built
            self.build_id: str = data["build_id"]
            self.files: dict[str, dict] = data["files"]
            self.parts: int = data["parts"]
            self.documents: int = data["documents"]
            self.bands = BandIndex.load(self.root / "bands.npz")
            self.ngrams = NgramIndex.load(self.root / "ngrams.npz")
            self._sig_parts = [np.load(self.root / "sigs.npy")]
            self._win_parts = [np.load(self.root / "windows.npy")]
            self.live = np.load(self.root / "live.npy")
        else:
            self.config = config or IndexConfig()
            self._empty()
        self.hasher = self.config.hasher()
        self._docs: pa.Table | None = None

    def _empty(self) -> None:
        b, r = self.config.banding()
        self.build_id = uuid.uuid4().hex  # embeddings and other per-document data are valid within one build
        self.files, self.parts, self.documents = {}, 0, 0
        self.bands = BandIndex(b, r)
        self.ngrams = NgramIndex(self.config.max_df)
        self._sig_parts = [np.zeros((0, self.config.num_perm), np.uint32)]
        self._win_parts = [np.zeros(0, np.int64)]
        self.live = np.zeros(0, bool)

    def _clear(self) -> None:
        if self.root.exists():
            for p in self.root.iterdir():
                if p.name in _ARRAYS or (p.name.startswith("docs-") and p.suffix == ".parquet"):
                    p.unlink()

    @property
    def size(self) -> int:
        """Current (not retired) documents."""
        return int(self.live.sum())

    @property
    def window_doc(self) -> np.ndarray:
        if len(self._win_parts) > 1:
            self._win_parts = [np.concatenate(self._win_parts)]
        return self._win_parts[0]

    @property
    def sigs(self) -> np.ndarray:
        if len(self._sig_parts) > 1:
            self._sig_parts = [np.concatenate(self._sig_parts)]
        return self._sig_parts[0]

    # -- fingerprints (shared by documents and queries) ---------------------------------

    def _fingerprint(
        self, texts: Sequence[str], python: Sequence[bool | None], winnowed: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[CodeViews | None]]:
        """Window signatures (and the text each window belongs to), n-grams (hashes, owning
        text) and code views of a batch of texts. Reference documents are winnowed; queries
        keep every n-gram."""
        c = self.config
        flat, lengths, strings = self.hasher.text_hashes(texts)
        doc_hashes = np.split(flat, np.cumsum(lengths)[:-1]) if len(texts) else []
        win_hashes, win_owner = [], []
        for i, h in enumerate(doc_hashes):
            for s in window_starts(len(h), c.window_words):
                win_hashes.append(h[s : s + c.window_words])
                win_owner.append(i)
        owner = np.asarray(win_owner, dtype=np.int64)
        sigs = self.hasher.signatures_from_hashes(win_hashes, lambda k: strings[win_owner[k]])
        hs, os = [], []
        w_text = c.guaranteed_run - c.index_ngram + 1 if winnowed else 1
        h, o = batch_ngrams(doc_hashes, c.index_ngram, TEXT)
        h, o = winnow(h, o, w_text)
        hs.append(h)
        os.append(o)
        prose_streams, code_streams, owners_pc = [], [], []
        all_views: list[CodeViews | None] = [None] * len(texts)
        for i, (t, py) in enumerate(zip(texts, python)):
            if py is False:
                continue
            views = all_views[i] = views_of(t, py)
            if views is None:
                continue
            owners_pc.append(i)
            same = views.prose == strings[i].split()
            prose_streams.append(np.zeros(0, np.uint64) if same else self.hasher.word_hashes(views.prose))
            code_streams.append(self.hasher.word_hashes(views.code))
        if owners_pc:
            idx = np.asarray(owners_pc, dtype=np.int64)
            h, o = batch_ngrams(prose_streams, c.index_ngram, PROSE)
            h, o = winnow(h, o, w_text)
            hs.append(h)
            os.append(idx[o])
            h, o = batch_ngrams(code_streams, c.code_index_ngram, CODE)
            h, o = winnow(h, o, c.code_guaranteed_run - c.code_index_ngram + 1 if winnowed else 1)
            hs.append(h)
            os.append(idx[o])
        return sigs, owner, np.concatenate(hs), np.concatenate(os), all_views

    # -- building ------------------------------------------------------------------------

    def add(self, docs: Iterable[CorpusDoc], progress: Callable[[int], None] | None = None) -> int:
        """Index documents (streamed in batches); returns how many were added. Call save() after."""
        added = 0
        self.root.mkdir(parents=True, exist_ok=True)
        for batch in _batches(docs):
            texts = [d.text for d in batch]
            sigs, owner, ng_h, ng_o, _ = self._fingerprint(texts, [None] * len(batch), True)
            self.bands.add(sigs)
            self._sig_parts.append(sigs)
            self._win_parts.append(owner + self.documents)
            self.ngrams.add(ng_h, ng_o + self.documents)
            self.live = np.concatenate([self.live, np.ones(len(batch), bool)])
            self.documents += len(batch)
            table = pa.table({"corpus": [d.corpus for d in batch], "doc_id": [d.doc_id for d in batch], "text": texts})
            pq.write_table(table, self.root / f"docs-{self.parts:05d}.parquet")
            self.parts += 1
            added += len(batch)
            self._docs = None
            if progress:
                progress(added)
        return added

    def _retire(self, key: str) -> None:
        entry = self.files.pop(key)
        self.live[entry["first"] : entry["first"] + entry["count"]] = False

    def _add_file(
        self, key: str, corpus: str, digest: str, docs: Iterable[CorpusDoc], progress: Callable[[int], None] | None
    ) -> int:
        first = self.documents
        n = self.add(docs, progress)
        self.files[key] = {"corpus": corpus, "digest": digest, "first": first, "count": n}
        return n

    def sync(self, corpora: dict[str, Path | None], progress: Callable[[int], None] | None = None) -> SyncReport:
        """Make the index hold exactly these corpora ({name: path}; path None = built-in HumanEval)."""
        report = SyncReport(rebuilt=self.rebuilt)
        wanted: dict[str, tuple[str, str, Path | None]] = {}  # key -> (corpus, digest, file)
        for name, path in corpora.items():
            if path is None:
                wanted[f"builtin:{HUMANEVAL}"] = (name, humaneval_digest(), None)
                continue
            for file, digest in fingerprint(Path(path).resolve()).items():
                wanted[file] = (name, digest, Path(file))
        for key in list(self.files):
            if key not in wanted:
                self._retire(key)
                report.removed_files.append(key)
        for key, (corpus, digest, file) in wanted.items():
            known = self.files.get(key)
            if known is not None and known["digest"] == digest and known["corpus"] == corpus:
                report.unchanged_files += 1
                continue
            if known is not None:
                self._retire(key)
                report.changed_files.append(key)
            else:
                report.added_files.append(key)

            def reject(where: str, why: str) -> None:
                report.rejects.append(f"{where}: {why}")

            docs = humaneval() if file is None else read_corpus(file, corpus, on_error=reject)
            report.added_docs += self._add_file(key, corpus, digest, docs, progress)
        retired = self.documents - self.size
        if retired and retired > self.size:
            self.compact()
        self.save()
        return report

    def compact(self) -> None:
        """Rebuild from the stored texts of the current documents (retired ones are dropped)."""
        tmp = self.root.with_name(self.root.name + ".compacting")
        if tmp.exists():
            shutil.rmtree(tmp)
        fresh = ReferenceIndex(tmp, self.config)
        table = self.docs()
        keep = pa.array(self.live)
        for key, entry in sorted(self.files.items(), key=lambda kv: kv[1]["first"]):
            rows = table.slice(entry["first"], entry["count"]).filter(keep.slice(entry["first"], entry["count"]))
            docs = (
                CorpusDoc(c, d, t)
                for c, d, t in zip(*(rows.column(n).to_pylist() for n in ("corpus", "doc_id", "text")))
            )
            fresh._add_file(key, entry["corpus"], entry["digest"], docs, None)
        fresh.save()
        self._clear()
        for p in tmp.iterdir():
            p.replace(self.root / p.name)
        tmp.rmdir()
        again = ReferenceIndex(self.root, self.config)
        self.__dict__.update(again.__dict__)

    def save(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.bands.save(self.root / "bands.npz")
        self.ngrams.save(self.root / "ngrams.npz")
        np.save(self.root / "sigs.npy", self.sigs)
        np.save(self.root / "windows.npy", self.window_doc)
        np.save(self.root / "live.npy", self.live)
        manifest = {
            "format": FORMAT,
            "build_id": self.build_id,
            "index": asdict(self.config),
            "bands": self.bands.bands,
            "rows": self.bands.rows,
            "documents": self.documents,
            "live_documents": self.size,
            "windows": int(self.bands.size),
            "ngram_postings": self.ngrams.size,
            "parts": self.parts,
            "files": self.files,
        }
        write_atomic(self.root / "manifest.json", json.dumps(manifest, indent=2))

    def corpus_summary(self) -> dict[str, dict]:
        """corpus -> {files, documents} of what the index currently holds."""
        out: dict[str, dict] = {}
        for entry in self.files.values():
            s = out.setdefault(entry["corpus"], {"files": 0, "documents": 0})
            s["files"] += 1
            s["documents"] += entry["count"]
        return out

    # -- querying ------------------------------------------------------------------------

    def docs(self) -> pa.Table:
        if self._docs is None:
            parts = [pq.read_table(self.root / f"docs-{i:05d}.parquet", memory_map=True) for i in range(self.parts)]
            self._docs = (
                pa.concat_tables(parts)
                if parts
                else pa.table(
                    {
                        "corpus": pa.array([], pa.string()),
                        "doc_id": pa.array([], pa.string()),
                        "text": pa.array([], pa.string()),
                    }
                )
            )
        return self._docs

    def search(
        self,
        queries: Sequence[QueryText | str],
        config: DedupConfig | None = None,
        corpora: Iterable[str] | None = None,
    ) -> list[Candidate]:
        """Every candidate document of every query, confirmed; one Candidate per (query, document).

        `corpora`: only documents of these corpora (None: all current documents).
        """
        config = (config or DedupConfig()).with_index(self.config)
        qs = [q if isinstance(q, QueryText) else QueryText(q) for q in queries]
        if not qs or self.documents == 0:
            return []
        q_sigs, owner, ng_h, ng_o, q_views = self._fingerprint([q.text for q in qs], [q.python for q in qs], False)
        proposed: dict[tuple[int, int], set[str]] = {}
        best_est: dict[tuple[int, int], float] = {}
        if len(q_sigs) and self.bands.size:
            wq, ws = self.bands.query(q_sigs)
            if len(wq):
                doc_of = self.window_doc[ws]
                est = (q_sigs[wq] == self.sigs[ws]).mean(axis=1)
                for t, d, e in zip(owner[wq].tolist(), doc_of.tolist(), est.tolist()):
                    proposed.setdefault((t, d), set()).add("lsh")
                    best_est[(t, d)] = max(best_est.get((t, d), 0.0), e)
        nq, nd = self.ngrams.query(ng_h, ng_o)
        for t, d in zip(nq.tolist(), nd.tolist()):
            proposed.setdefault((t, d), set()).add("ngram")
        allowed = set(corpora) if corpora is not None else None
        pairs = sorted(p for p in proposed if self.live[p[1]])
        if not pairs:
            return []
        table = self.docs().take(pa.array([d for _, d in pairs]))
        corpus_col, id_col, text_col = (table.column(c).to_pylist() for c in ("corpus", "doc_id", "text"))
        prepared_q: dict[int, Prepared] = {}
        prepared_d: dict[int, Prepared] = {}
        out = []
        for (t, d), corpus, doc_id, body in zip(pairs, corpus_col, id_col, text_col):
            if allowed is not None and corpus not in allowed:
                continue
            if t not in prepared_q:
                prepared_q[t] = prepare(qs[t].text, self.hasher, self.config.window_words, qs[t].python, q_views[t])
            if d not in prepared_d:
                prepared_d[d] = prepare(body, self.hasher, self.config.window_words, None)
            if (t, d) not in best_est:
                best_est[(t, d)] = self._estimate(q_sigs, owner, t, d)
            match = compare(config, prepared_q[t], prepared_d[d])
            out.append(Candidate(t, corpus, doc_id, round(best_est[(t, d)], 4), match, tuple(sorted(proposed[(t, d)]))))
        return out

    def _estimate(self, q_sigs: np.ndarray, owner: np.ndarray, query: int, doc: int) -> float:
        """The best MinHash estimate over the pair's window pairs (for n-gram-only candidates)."""
        lo, hi = np.searchsorted(owner, query), np.searchsorted(owner, query, side="right")
        wlo, whi = np.searchsorted(self.window_doc, doc), np.searchsorted(self.window_doc, doc, side="right")
        if lo == hi or wlo == whi:
            return 0.0
        mine, theirs = q_sigs[lo:hi], self.sigs[wlo:whi]
        return float((mine[:, None, :] == theirs[None, :, :]).mean(axis=2).max())
