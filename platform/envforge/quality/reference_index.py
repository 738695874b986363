"""A persisted LSH index over reference corpora, built once and grown incrementally.

Documents are indexed window by window (`window_words`, half-overlapping), and queries are
windowed the same way: a task that copies part of a long benchmark document (a prompt and
its solution, without the tests) has a low Jaccard with the whole document but a high one
with the windows it copied. Confirmation reports the best window-pair Jaccard.

On disk (one directory):
  manifest.json   config, banding, document count, and a content digest per corpus file
  bands.npz       the banded LSH arrays over windows (see lsh.BandIndex)
  sigs.npy, windows.npy   window signatures and the document each window belongs to
  docs-NNNNN.parquet  corpus, doc_id, text of every indexed document, in index order

`sync(corpora)` adds only files whose digest is not in the manifest, so the nightly refresh
pays for new corpus data only. A file whose content changed cannot be un-indexed in place:
`sync` reports it and `rebuild=True` starts the index afresh.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from envforge.quality.confirm import Match, confirm
from envforge.quality.minhash import exact_jaccard
from envforge.quality.text import tokens, windows
from envforge.quality.corpora import CorpusDoc, fingerprint, humaneval, read_corpus
from envforge.quality.lsh import BandIndex
from envforge.quality.params import DedupConfig

BATCH = 10_000
HUMANEVAL = "humaneval"


@dataclass
class SyncReport:
    added_docs: int = 0
    added_files: list[str] = field(default_factory=list)
    unchanged_files: int = 0
    changed_files: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Candidate:
    query: int
    corpus: str
    doc_id: str
    est_jaccard: float
    match: Match


def _batches(docs: Iterable[CorpusDoc], size: int = BATCH) -> Iterator[list[CorpusDoc]]:
    batch: list[CorpusDoc] = []
    for d in docs:
        batch.append(d)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class ReferenceIndex:
    def __init__(self, root: Path, config: DedupConfig = DedupConfig()):
        self.root = Path(root)
        self.config = config
        self.hasher = config.hasher()
        manifest = self.root / "manifest.json"
        if manifest.exists():
            data = json.loads(manifest.read_text())
            if data["config"] != asdict(config):
                raise ValueError(f"index {self.root} was built with other parameters; rebuild it "
                                 f"(envforge dedup index --rebuild)")
            self.files: dict[str, str] = data["files"]
            self.parts: int = data["parts"]
            self.bands = BandIndex.load(self.root / "bands.npz")
            self._sig_parts = [np.load(self.root / "sigs.npy")]
            self._win_parts = [np.load(self.root / "windows.npy")]
            self.documents: int = data["documents"]
        else:
            b, r = config.banding()
            self.files, self.parts = {}, 0
            self.bands = BandIndex(b, r)
            self._sig_parts = [np.zeros((0, config.num_perm), np.uint32)]
            self._win_parts = [np.zeros(0, np.int64)]
            self.documents = 0
        self._docs: pa.Table | None = None

    @property
    def size(self) -> int:
        """Documents indexed."""
        return self.documents

    @property
    def window_doc(self) -> np.ndarray:
        if len(self._win_parts) > 1:
            self._win_parts = [np.concatenate(self._win_parts)]
        return self._win_parts[0]

    def _windows(self, text: str) -> list[str]:
        c = self.config
        return [" ".join(w) for w in windows(tokens(text), c.window_words, c.window_words // 2)]

    @property
    def sigs(self) -> np.ndarray:
        if len(self._sig_parts) > 1:
            self._sig_parts = [np.concatenate(self._sig_parts)]
        return self._sig_parts[0]

    # -- building ------------------------------------------------------------------------

    def add(self, docs: Iterable[CorpusDoc], progress: Callable[[int], None] | None = None) -> int:
        """Index documents (streamed in batches); returns how many were added. Call save() after."""
        added = 0
        self.root.mkdir(parents=True, exist_ok=True)
        for batch in _batches(docs):
            wins, owner = [], []
            for k, d in enumerate(batch):
                for w in self._windows(d.text):
                    wins.append(w)
                    owner.append(self.documents + k)
            sigs = self.hasher.signatures(wins)
            self.bands.add(sigs)
            self._sig_parts.append(sigs)
            self._win_parts.append(np.asarray(owner, dtype=np.int64))
            self.documents += len(batch)
            table = pa.table({"corpus": [d.corpus for d in batch], "doc_id": [d.doc_id for d in batch],
                              "text": [d.text for d in batch]})
            pq.write_table(table, self.root / f"docs-{self.parts:05d}.parquet")
            self.parts += 1
            added += len(batch)
            self._docs = None
            if progress:
                progress(added)
        return added

    def sync(self, corpora: dict[str, Path | None], progress: Callable[[int], None] | None = None) -> SyncReport:
        """Bring the index up to date with the corpora ({name: path}; path None = built-in humaneval)."""
        report = SyncReport()
        for name, path in corpora.items():
            if path is None:
                key = f"builtin:{HUMANEVAL}"
                if key in self.files:
                    report.unchanged_files += 1
                    continue
                report.added_docs += self.add(humaneval(), progress)
                self.files[key] = "builtin"
                report.added_files.append(key)
                continue
            for file, digest in fingerprint(Path(path)).items():
                known = self.files.get(file)
                if known == digest:
                    report.unchanged_files += 1
                elif known is not None:
                    report.changed_files.append(file)
                else:
                    report.added_docs += self.add(read_corpus(Path(file), name), progress)
                    self.files[file] = digest
                    report.added_files.append(file)
        self.save()
        return report

    def save(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.bands.save(self.root / "bands.npz")
        np.save(self.root / "sigs.npy", self.sigs)
        np.save(self.root / "windows.npy", self.window_doc)
        manifest = {"config": asdict(self.config), "bands": self.bands.bands, "rows": self.bands.rows,
                    "documents": self.documents, "windows": int(self.bands.size), "parts": self.parts, "files": self.files}
        tmp = self.root / "manifest.json.tmp"
        tmp.write_text(json.dumps(manifest, indent=2))
        tmp.replace(self.root / "manifest.json")

    # -- querying ------------------------------------------------------------------------

    def docs(self) -> pa.Table:
        if self._docs is None:
            parts = [pq.read_table(self.root / f"docs-{i:05d}.parquet", memory_map=True) for i in range(self.parts)]
            self._docs = pa.concat_tables(parts) if parts else pa.table({"corpus": [], "doc_id": [], "text": []})
        return self._docs

    def search(self, texts: list[str]) -> list[Candidate]:
        """Every candidate document of every text, confirmed: best window-pair exact Jaccard,
        longest shared word run over the whole texts. One Candidate per (text, document)."""
        q_wins, q_owner = [], []
        for i, t in enumerate(texts):
            for w in self._windows(t):
                q_wins.append(w)
                q_owner.append(i)
        if not q_wins or self.bands.size == 0:
            return []
        q_sigs = self.hasher.signatures(q_wins)
        qs, ws = self.bands.query(q_sigs)
        if len(qs) == 0:
            return []
        owner = np.asarray(q_owner)
        doc_of = self.window_doc[ws]
        est = (q_sigs[qs] == self.sigs[ws]).mean(axis=1)
        best_est: dict[tuple[int, int], float] = {}
        for t, d, e in zip(owner[qs].tolist(), doc_of.tolist(), est.tolist()):
            best_est[(t, d)] = max(best_est.get((t, d), 0.0), e)
        pairs = sorted(best_est)
        docs = self.docs().take(pa.array([d for _, d in pairs]))
        corpora, ids, bodies = (docs.column(c).to_pylist() for c in ("corpus", "doc_id", "text"))
        out = []
        for (t, d), corpus, doc_id, body in zip(pairs, corpora, ids, bodies):
            out.append(Candidate(t, corpus, doc_id, round(best_est[(t, d)], 4), self._confirm(texts[t], body)))
        return out

    def _confirm(self, text: str, body: str) -> Match:
        """Best window-pair Jaccard (containment-friendly) and the longest shared run of the whole texts."""
        whole = confirm(self.config, text, body, self.hasher)
        a = [self.hasher.shingle_hashes(w) for w in self._windows(text)]
        b = [self.hasher.shingle_hashes(w) for w in self._windows(body)]
        best = max((exact_jaccard(x, y) for x in a for y in b), default=0.0)
        best = max(best, whole.exact_jaccard)
        return Match(round(best, 6), whole.longest_shared_ngram, best >= self.config.threshold, whole.verbatim)
