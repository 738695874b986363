"""MinHash, LSH, corpora and the persisted reference index (no Docker needed)."""

from __future__ import annotations

import gzip
import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasketch import MinHash

from envforge.quality.confirm import confirm
from envforge.quality.corpora import read_corpus
from envforge.quality.lsh import BandIndex, banding, collision_probability
from envforge.quality.minhash import EMPTY_SLOT, MinHasher, estimate_jaccard, exact_jaccard
from envforge.quality.params import RECALL_WEIGHTS, DedupConfig, IndexConfig
from envforge.quality.reference_index import IndexMismatch, ReferenceIndex
from envforge.quality.text import tokens

VOCAB = [f"word{i}" for i in range(3000)]


def doc(rng: random.Random, n: int = 200) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(n))


def edit(rng: random.Random, text: str, rate: float) -> str:
    return " ".join(w if rng.random() > rate else rng.choice(VOCAB) for w in text.split())


def test_batched_signatures_equal_per_document_signatures():
    rng = random.Random(1)
    texts = [doc(rng) for _ in range(50)] + ["a short instruction", "", "x" * 3]
    h = MinHasher()
    batched = h.signatures(texts)
    single = h.signatures_from_shingles([h.shingle_hashes(t) for t in texts])
    assert batched.dtype == np.uint32 and batched.shape == (53, 128)
    assert (batched == single).all()
    assert (batched[51] == EMPTY_SLOT).all()  # the empty text


def test_estimates_match_exact_jaccard_and_datasketch_within_sampling_error():
    rng = random.Random(2)
    h = MinHasher()
    errors, ds_errors = [], []
    for rate in np.linspace(0.02, 0.3, 30):
        a = doc(rng)
        b = edit(rng, a, rate)
        exact = exact_jaccard(h.shingle_hashes(a), h.shingle_hashes(b))
        sig = h.signatures([a, b])
        errors.append(estimate_jaccard(sig[0], sig[1]) - exact)
        m1, m2 = MinHash(num_perm=128), MinHash(num_perm=128)
        for m, t in ((m1, a), (m2, b)):
            w = tokens(t)
            for i in range(len(w) - 4):
                m.update(" ".join(w[i: i + 5]).encode())
        ds_errors.append(m1.jaccard(m2) - exact)
    sd = np.sqrt(0.25 / 128)  # the largest possible sampling s.d. at 128 permutations
    assert abs(np.mean(errors)) < sd and np.max(np.abs(errors)) < 4 * sd
    assert abs(np.mean(np.abs(errors)) - np.mean(np.abs(ds_errors))) < sd


def test_recall_weighted_banding_catches_pairs_at_the_threshold():
    b_default, r_default = banding(0.5, 128, (0.5, 0.5))
    b, r = banding(0.5, 128, RECALL_WEIGHTS)
    assert collision_probability(0.5, b, r) > collision_probability(0.5, b_default, r_default)
    assert collision_probability(0.5, b, r) > 0.8 and collision_probability(0.8, b, r) > 0.999


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.8])
def test_banding_matches_datasketchs_choice(threshold):
    """Our optimiser is datasketch's (MinHashLSH exposes the bands and rows it chose), without its private helper."""
    from datasketch import MinHashLSH

    for weights in ((0.1, 0.9), (0.5, 0.5)):
        lsh = MinHashLSH(threshold=threshold, num_perm=128, weights=weights)
        assert banding(threshold, 128, weights) == (lsh.b, lsh.r)


def test_band_index_finds_near_duplicates_and_round_trips(tmp_path):
    rng = random.Random(3)
    base = [doc(rng) for _ in range(300)]
    near = [edit(rng, base[i], 0.03) for i in range(20)]
    h = MinHasher()
    b, r = banding(0.5, 128, RECALL_WEIGHTS)
    index = BandIndex(b, r)
    index.add(h.signatures(base[:150]))
    index.add(h.signatures(base[150:]))  # two batches, merged lazily
    qs, ds = index.query(h.signatures(near))
    found = set(zip(qs.tolist(), ds.tolist()))
    assert all((i, i) in found for i in range(20))
    assert len(found) < 60  # random documents rarely collide
    index.save(tmp_path / "bands.npz")
    again = BandIndex.load(tmp_path / "bands.npz")
    q2, d2 = again.query(h.signatures(near))
    assert set(zip(q2.tolist(), d2.tolist())) == found


def test_corpus_readers_and_errors(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.jsonl").write_text('{"id": "x1", "text": "alpha beta"}\n\n{"prompt": "gamma"}\n')
    with gzip.open(tmp_path / "c" / "b.jsonl.gz", "wt") as fh:
        fh.write('{"task_id": "z", "content": "zeta"}\n')
    pq.write_table(pa.table({"doc_id": ["p1"], "text": ["from parquet"]}), tmp_path / "c" / "d.parquet")
    (tmp_path / "c" / "notes.txt").write_text("a whole text file")
    docs = list(read_corpus(tmp_path / "c", "mine"))
    assert [(d.doc_id, d.text) for d in docs] == [
        ("x1", "alpha beta"), ("a.jsonl:3", "gamma"), ("z", "zeta"), ("p1", "from parquet"),
        ("notes.txt", "a whole text file")]
    assert {d.corpus for d in docs} == {"mine"}
    (tmp_path / "bad.jsonl").write_text('{"id": 1}\nnot json\n[1, 2]\n{"id": "ok", "text": "kept"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: no text in any of the fields"):
        list(read_corpus(tmp_path / "bad.jsonl"))
    problems = []
    kept = list(read_corpus(tmp_path / "bad.jsonl", on_error=lambda where, why: problems.append(f"{where}: {why}")))
    assert [d.doc_id for d in kept] == ["ok"]  # the good record goes through, every bad one is named
    assert [p.split(": ", 1)[0].rsplit("/", 1)[-1] for p in problems] == ["bad.jsonl:1", "bad.jsonl:2", "bad.jsonl:3"]
    assert "not a JSON record" in problems[1] and "record is a list, not an object" in problems[2]
    with pytest.raises(FileNotFoundError):
        list(read_corpus(tmp_path / "missing"))


def test_reference_index_follows_its_corpora(tmp_path):
    rng = random.Random(4)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    texts = [doc(rng) for _ in range(30)]
    (corpus / "one.jsonl").write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n"
                                              for i, t in enumerate(texts)))
    root = tmp_path / "index"
    first = ReferenceIndex(root).sync({"mine": corpus})
    assert first.added_docs == 30 and first.unchanged_files == 0
    reopened = ReferenceIndex(root)
    assert reopened.size == 30
    again = reopened.sync({"mine": corpus})
    assert again.added_docs == 0 and again.unchanged_files == 1
    (corpus / "two.jsonl").write_text(json.dumps({"id": "new", "text": doc(rng)}) + "\n")
    grown = ReferenceIndex(root).sync({"mine": corpus})
    assert grown.added_docs == 1 and grown.added_files == [str(corpus / "two.jsonl")]
    hits = ReferenceIndex(root).search([edit(rng, texts[7], 0.02), doc(rng)])
    assert [(c.query, c.doc_id) for c in hits if c.match.flagged] == [(0, "d7")]

    # An edited file is re-read: its old documents are retired (and the index compacted).
    (corpus / "one.jsonl").write_text(json.dumps({"id": "x", "text": texts[3]}) + "\n")
    changed = ReferenceIndex(root).sync({"mine": corpus})
    assert changed.changed_files == [str(corpus / "one.jsonl")] and changed.added_docs == 1
    index = ReferenceIndex(root)
    assert index.size == 2 and index.documents == 2  # compacted: 30 retired > 2 current
    assert [c.doc_id for c in index.search([texts[7], texts[3]]) if c.match.flagged] == ["x"]
    # Decision rules are not index parameters: another threshold runs on the same index.
    edited = edit(random.Random(9), texts[3], 0.1)
    strict, loose = (index.search([edited], DedupConfig(threshold=t))[0].match for t in (0.5, 0.3))
    assert 0.3 <= strict.exact_jaccard < 0.5 and not strict.near_duplicate and loose.near_duplicate

    # A corpus no longer given is retired.
    gone = ReferenceIndex(root).sync({})
    assert sorted(gone.removed_files) == [str(corpus / "one.jsonl"), str(corpus / "two.jsonl")]
    assert ReferenceIndex(root).size == 0 and ReferenceIndex(root).search([texts[3]]) == []

    # Index parameters are the index's: asking for others names them and the command that rebuilds.
    with pytest.raises(IndexMismatch, match=r"candidate_threshold 0.5 \(asked: 0.3\).*"
                                           r"envforge dedup index --rebuild --candidate-threshold 0.3"):
        ReferenceIndex(root, IndexConfig(candidate_threshold=0.3))


def test_confirmation_flags_verbatim_leaks_below_the_jaccard_threshold():
    rng = random.Random(5)
    leak = doc(rng, 20)
    a = doc(rng, 300) + " " + leak
    b = doc(rng, 300) + " " + leak
    m = confirm(DedupConfig(), a, b)
    assert m.exact_jaccard < 0.5 and m.longest_shared_ngram >= 20 and m.verbatim and m.flagged


def test_every_index_parameter_can_be_rebuilt_with_from_the_cli():
    """The advice an index gives on a mismatch (`--rebuild --name value`) is always a real option."""
    import inspect
    from dataclasses import fields

    from envforge.cli.dedup import dedup_index

    assert {f.name for f in fields(IndexConfig)} <= set(inspect.signature(dedup_index).parameters)
    assert IndexConfig(candidate_threshold=0.3, max_df=7).cli_flags() == "--candidate-threshold 0.3 --max-df 7"
