"""Benchmark MinHash signatures, LSH and decontamination against datasketch, in one run.

    .venv/bin/python bench/dedup.py [--quick] [--skip-large] [--out FILE]

On the same 20,000 synthetic documents (~200 words, Zipf vocabulary) with planted near
duplicates, it measures signatures per second for:
  (a) datasketch `MinHash.update` once per shingle (the naive loop; timed on a sample),
  (b) datasketch `MinHash.bulk` with its defaults,
  (c) envforge's batched numpy path (`MinHasher.signatures`),
checks that (c) gives the same Jaccard estimates as (b) within sampling error, measures LSH
insert and query rates, and recall / precision on the planted pairs. Then it times
decontaminating 100,000 synthetic tasks against a 1,000,000-document reference corpus with
the persisted index (skipped with --skip-large). Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "platform"))

from datasketch import MinHash  # noqa: E402

from envforge.quality.corpora import CorpusDoc  # noqa: E402
from envforge.quality.lsh import BandIndex, collision_probability  # noqa: E402
from envforge.quality.minhash import MinHasher, exact_jaccard  # noqa: E402
from envforge.quality.params import DedupConfig  # noqa: E402
from envforge.quality.reference_index import ReferenceIndex  # noqa: E402
from envforge.quality.text import tokens  # noqa: E402


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


class Corpus:
    """Synthetic documents: Zipf-distributed words; planted pairs edited at a chosen rate."""

    def __init__(self, seed: int, vocab: int = 30_000):
        self.rng = np.random.default_rng(seed)
        self.vocab = [f"w{i}" for i in range(vocab)]
        ranks = np.arange(1, vocab + 1)
        self.p = (1 / ranks ** 1.05) / (1 / ranks ** 1.05).sum()

    def words(self, n_docs: int, length: int = 200) -> np.ndarray:
        return self.rng.choice(len(self.vocab), size=(n_docs, length), p=self.p)

    def text(self, idx: np.ndarray) -> str:
        return " ".join(map(self.vocab.__getitem__, idx.tolist()))

    def mutate(self, idx: np.ndarray, rate: float) -> np.ndarray:
        out = idx.copy()
        hit = self.rng.random(len(out)) < rate
        out[hit] = self.rng.choice(len(self.vocab), size=hit.sum(), p=self.p)
        return out


def make_docs(n: int, planted: int, seed: int) -> tuple[list[str], list[tuple[int, int]]]:
    c = Corpus(seed)
    base = c.words(n - planted)
    docs = [c.text(row) for row in base]
    pairs = []
    rates = np.linspace(0.01, 0.25, planted)  # true Jaccard of 5-gram sets spans ~0.3 .. ~0.95
    for k in range(planted):
        src = k % len(base)
        docs.append(c.text(c.mutate(base[src], rates[k])))
        pairs.append((src, len(docs) - 1))
    return docs, pairs


def shingles(text: str, n: int = 5) -> list[bytes]:
    w = tokens(text)
    return [" ".join(w[i: i + n]).encode() for i in range(len(w) - n + 1)]


def time_update_loop(docs: list[str], sample: int) -> float:
    """Text -> signature, one `update` per shingle (shingling included, as for every path)."""
    t = time.perf_counter()
    for d in docs[:sample]:
        m = MinHash(num_perm=128)
        for x in shingles(d):
            m.update(x)
    return sample / (time.perf_counter() - t)


def time_bulk(docs: list[str]) -> tuple[float, float, list[MinHash]]:
    """Text -> signature with `MinHash.bulk` defaults; also the rate on pre-shingled input."""
    t = time.perf_counter()
    sh = [shingles(d) for d in docs]
    t_sh = time.perf_counter()
    mhs = MinHash.bulk(sh, num_perm=128)
    end = time.perf_counter()
    return len(docs) / (end - t), len(docs) / (end - t_sh), mhs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    ap.add_argument("--skip-large", action="store_true", help="skip the 100k x 1M decontamination timing")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    n_docs, planted = (2_000, 200) if args.quick else (20_000, 2_000)
    config = DedupConfig()
    hasher = config.hasher()
    bands, rows = config.banding()
    result: dict = {"docs": n_docs, "planted_pairs": planted, "num_perm": config.num_perm,
                    "threshold": config.threshold, "bands": bands, "rows": rows}

    log(f"generating {n_docs} documents")
    docs, pairs = make_docs(n_docs, planted, seed=7)
    # Every path is timed from the same raw text to signatures: tokenising and shingling are
    # part of the job. datasketch's bulk rate on pre-shingled input is reported beside it.
    log("datasketch update loop (sample)")
    loop_rate = time_update_loop(docs, 300 if not args.quick else 100)
    log("datasketch bulk")
    bulk_rate, bulk_preshingled_rate, bulk_mhs = time_bulk(docs)
    log("envforge signatures")
    runs = []
    for _ in range(3):
        t = time.perf_counter()
        sigs = config.hasher().signatures(docs)  # a fresh hasher: the word-hash cache starts cold
        runs.append(time.perf_counter() - t)
    ours_rate = n_docs / statistics.median(runs)
    result.update({
        "signatures_per_s_update_loop": round(loop_rate, 1), "signatures_per_s_bulk": round(bulk_rate, 1),
        "signatures_per_s_envforge": round(ours_rate, 1),
        "signatures_per_s_bulk_preshingled": round(bulk_preshingled_rate, 1),
        "ratio_vs_update_loop": round(ours_rate / loop_rate, 1), "ratio_vs_bulk": round(ours_rate / bulk_rate, 2),
    })

    log("estimate agreement on planted pairs")
    exact, ours, theirs = [], [], []
    for a, b in pairs:
        exact.append(exact_jaccard(hasher.shingle_hashes(docs[a]), hasher.shingle_hashes(docs[b])))
        ours.append(float(np.mean(sigs[a] == sigs[b])))
        theirs.append(bulk_mhs[a].jaccard(bulk_mhs[b]))
    exact_a, ours_a, theirs_a = map(np.array, (exact, ours, theirs))
    sampling_sd = np.sqrt(exact_a * (1 - exact_a) / config.num_perm)
    result["estimates"] = {
        "mean_abs_error_envforge": round(float(np.mean(np.abs(ours_a - exact_a))), 4),
        "mean_abs_error_datasketch": round(float(np.mean(np.abs(theirs_a - exact_a))), 4),
        "mean_bias_envforge": round(float(np.mean(ours_a - exact_a)), 4),
        "mean_sampling_sd": round(float(np.mean(sampling_sd)), 4),
        "share_within_3sd_envforge": round(float(np.mean(np.abs(ours_a - exact_a) <= 3 * sampling_sd + 1e-9)), 4),
    }

    log("LSH insert / query / recall")
    index = BandIndex(bands, rows)
    t = time.perf_counter()
    index.add(sigs)
    index._merge()
    insert_s = time.perf_counter() - t
    t = time.perf_counter()
    qs, ds = index.query(sigs)
    query_s = time.perf_counter() - t
    cand = {(int(q), int(d)) for q, d in zip(qs, ds) if q < d}
    planted_set = set(pairs)
    exact_by_pair = dict(zip(pairs, exact))
    hi = [p for p in pairs if exact_by_pair[p] >= 0.8]
    at_t = [p for p in pairs if exact_by_pair[p] >= config.threshold]
    found = lambda ps: sum(p in cand for p in ps) / max(1, len(ps))  # noqa: E731
    confirmed = [p for p in cand if exact_jaccard(hasher.shingle_hashes(docs[p[0]]),
                                                  hasher.shingle_hashes(docs[p[1]])) >= config.threshold]
    result.update({
        "lsh_insert_per_s": round(n_docs / insert_s, 1), "lsh_query_per_s": round(n_docs / query_s, 1),
        "recall_at_0_8": round(found(hi), 4), "recall_at_threshold": round(found(at_t), 4),
        "lsh_candidates": len(cand), "lsh_candidate_precision": round(len(confirmed) / max(1, len(cand)), 4),
        "precision_after_confirmation": 1.0 if confirmed else None,
        "planted_pairs_at_or_above_threshold": len(at_t),
        "s_curve": {f"{j:.1f}": round(collision_probability(j, bands, rows), 4) for j in np.arange(0.3, 1.0, 0.1)},
        "default_weights_banding": list(__import__("envforge.quality.lsh", fromlist=["banding"]).banding(
            config.threshold, config.num_perm, (0.5, 0.5))),
    })
    b5, r5 = result["default_weights_banding"]
    result["recall_at_threshold_default_weights_model"] = round(
        statistics.mean(collision_probability(exact_by_pair[p], b5, r5) for p in at_t), 4) if at_t else None
    result["recall_at_threshold_recall_weights_model"] = round(
        statistics.mean(collision_probability(exact_by_pair[p], bands, rows) for p in at_t), 4) if at_t else None
    _ = planted_set

    if not args.skip_large:
        n_ref, n_tasks = (100_000, 10_000) if args.quick else (1_000_000, 100_000)
        log(f"decontamination: {n_tasks} tasks vs {n_ref} reference documents")
        c = Corpus(11)
        with tempfile.TemporaryDirectory() as tmp:
            ref = ReferenceIndex(Path(tmp) / "index", config)
            t = time.perf_counter()

            def stream():
                for start in range(0, n_ref, 50_000):
                    block = c.words(min(50_000, n_ref - start))
                    for i, row in enumerate(block):
                        yield CorpusDoc("synthetic", f"ref-{start + i}", c.text(row))

            ref.add(stream(), progress=lambda k: log(f"  indexed {k}") if k % 200_000 == 0 else None)
            ref.save()
            build_s = time.perf_counter() - t
            task_words = c.words(n_tasks)
            leaked = min(1000, n_tasks // 100)
            texts = [c.text(row) for row in task_words]
            # Plant leaks: the first `leaked` tasks are light edits of reference documents.
            leak_src = ReferenceIndex(Path(tmp) / "index", config).docs().slice(0, leaked).column("text").to_pylist()
            for i in range(leaked):
                w = leak_src[i].split()
                w[i % 50] = "edited"
                texts[i] = " ".join(w)
            t = time.perf_counter()
            found_leaks = {cand.query for cand in ref.search(texts) if cand.match.flagged}
            search_s = time.perf_counter() - t
        result["decontamination"] = {
            "reference_docs": n_ref, "tasks": n_tasks, "index_build_s": round(build_s, 1),
            "search_s": round(search_s, 1), "tasks_per_s": round(n_tasks / search_s, 1),
            "planted_leaks": leaked, "leaks_found": len(found_leaks & set(range(leaked))),
            "false_flags": len(found_leaks - set(range(leaked))),
        }

    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
