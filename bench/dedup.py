"""Benchmark decontamination: MinHash against datasketch, recall and false positives on
HumanEval leaks and clean tasks, and the 100k tasks x 1M documents run. One JSON document.

    .venv/bin/python bench/dedup.py [--quick] [--skip-large] [--skip-recall] [--out FILE]

1. Signatures, on 20,000 synthetic documents (~200 words, Zipf vocabulary) with planted near
   duplicates, text to signature (shingling included) per second for:
     (a) datasketch `MinHash.update` once per shingle (the naive loop; timed on a sample),
     (b) datasketch `MinHash.bulk` with its defaults (SHA-1),
     (c) datasketch `MinHash.bulk(..., hashfunc=xxhash.xxh32_intdigest)`: the library used well,
     (d) envforge's batched numpy path (`MinHasher.signatures`), a fresh hasher each time;
   (c) and (d) alternate over several rounds and their medians are compared
   (`ratio_vs_bulk_xxh32`). Then estimate agreement, LSH rates, recall and precision.
2. Recall on all 164 HumanEval problems in six disguises (bench/dedup_sets.py) and false
   positives on 1,100 generated clean tasks, end to end (task folders, load_specs, fields,
   workspace scan, index, confirmation); exact-stage and stub-embedding results on the
   paraphrase set in tests/fixtures/dedup/paraphrases.json.
3. Decontaminating 100,000 synthetic tasks against a 1,000,000-document reference corpus with
   the persisted index, with two kinds of planted leaks: light edits of a whole document, and
   a 30-word excerpt inside otherwise unrelated text (skipped with --skip-large).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "platform"))
sys.path.insert(0, str(REPO))  # bench.dedup_sets, and the tests' stub embedding server

import xxhash  # noqa: E402
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


def time_bulk(docs: list[str], **kw) -> tuple[float, float, list[MinHash]]:
    """Text -> signature with `MinHash.bulk` (`kw`: e.g. hashfunc); also the rate on pre-shingled input."""
    t = time.perf_counter()
    sh = [shingles(d) for d in docs]
    t_sh = time.perf_counter()
    mhs = MinHash.bulk(sh, num_perm=128, **kw)
    end = time.perf_counter()
    return len(docs) / (end - t), len(docs) / (end - t_sh), mhs


def time_envforge(config: DedupConfig, docs: list[str]) -> tuple[float, np.ndarray]:
    """Text -> signature with a fresh MinHasher (nothing carried over between runs)."""
    t = time.perf_counter()
    sigs = config.hasher().signatures(docs)
    return len(docs) / (time.perf_counter() - t), sigs


def recall_section(quick: bool) -> dict:
    """HumanEval leaks in six disguises and clean tasks, end to end; the paraphrase set."""
    from bench.dedup_sets import clean_tasks, humaneval_variants, problem_of, python_version
    from envforge.quality.dedup import decontaminate
    from envforge.sources import load_specs

    out: dict = {"python": python_version()}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        log("recall: writing HumanEval variants and clean tasks")
        problems = [f"HumanEval/{i}" for i in range(0, 164, 8)] if quick else None
        variants = humaneval_variants(root / "he", seed=0, problems=problems)
        sizes = (40, 40, 30) if quick else (400, 400, 300)
        clean = clean_tasks(root / "clean", *sizes, seed=1)
        t = time.perf_counter()
        loaded = load_specs([root / "he", root / "clean"])
        load_s = time.perf_counter() - t
        assert not loaded.rejects, loaded.rejects[:3]
        index = ReferenceIndex(root / "index")
        index.sync({"humaneval": None})
        log(f"recall: decontaminating {len(loaded.tasks)} tasks")
        t = time.perf_counter()
        records, _ = decontaminate(loaded.tasks, index)
        seconds = time.perf_counter() - t
        by_id = {r.task_id: r for r in records}
        out["tasks"] = len(records)
        out["load_s"] = round(load_s, 1)
        out["decontaminate_s"] = round(seconds, 1)
        out["tasks_per_s"] = round(len(records) / seconds, 1)
        out["variants"] = {}
        for variant, ids in variants.items():
            hits = [i for i in ids if by_id[i].contaminated]
            exact = [i for i in hits if by_id[i].doc_id == problem_of(i)]
            only_ngram = [i for i in hits if by_id[i].evidence and "lsh" not in by_id[i].evidence[0].proposed_by]
            views: dict[str, int] = {}
            for i in hits:
                top = by_id[i].evidence[0]
                view = max(top.runs, key=lambda v: top.runs[v][0] / top.runs[v][1]) if top.runs else "jaccard"
                views[view] = views.get(view, 0) + 1
            out["variants"][variant] = {
                "tasks": len(ids), "caught": len(hits), "recall": round(len(hits) / len(ids), 4),
                "attributed_to_the_right_problem": len(exact), "proposed_only_by_ngram_index": len(only_ngram),
                "strongest_view": views, "missed": [i for i in ids if i not in set(hits)][:20]}
        out["clean"] = {}
        total = flagged = 0
        for kind, ids in clean.items():
            fp = [i for i in ids if by_id[i].contaminated]
            total, flagged = total + len(ids), flagged + len(fp)
            out["clean"][kind] = {"tasks": len(ids), "flagged": len(fp),
                                  "examples": [by_id[i].reason[:300] for i in fp[:5]]}
        out["clean_tasks"] = total
        out["false_positives"] = flagged
        out["false_positive_rate"] = round(flagged / total, 5)
        out["paraphrases"] = paraphrase_section(root, index)
    return out


def paraphrase_section(root: Path, index: ReferenceIndex) -> dict:
    """The hand-written paraphrase set: exact stages, and the semantic stage with the tests'
    stub embedding model (a hashed bag of words) served over HTTP on loopback."""
    from bench.dedup_sets import write_task
    from envforge.quality.dedup import decontaminate
    from envforge.quality.params import SemanticConfig
    from envforge.sources import load_specs
    from tests.dedup_stub_server import make_app, running

    fixture = json.loads((REPO / "tests" / "fixtures" / "dedup" / "paraphrases.json").read_text())
    for k, item in enumerate(fixture["paraphrases"]):
        write_task(root / "para", f"para-{k}", item["text"])
    for k, text in enumerate(fixture["clean"]):
        write_task(root / "para", f"twin-{k}", text)
    tasks = load_specs([root / "para"]).tasks
    source = {f"para-{k}": item["source"] for k, item in enumerate(fixture["paraphrases"])}

    def score(records) -> dict:
        by_id = {r.task_id: r for r in records}
        caught = [t for t in source if by_id[t].contaminated and by_id[t].doc_id == source[t]]
        fp = [t for t in by_id if t.startswith("twin-") and by_id[t].contaminated]
        ranks = []
        for t in source:
            sem = [e for e in by_id[t].evidence if e.semantic]
            ranks.append(next((e.semantic["cosine"] for e in sem if e.doc_id == source[t]), None))
        return {"paraphrases": len(source), "caught": len(caught), "clean_twins_flagged": len(fp),
                "source_in_top_k_cosines": ranks}

    exact, _ = decontaminate(tasks, index)
    out = {"exact_stages": score(exact)}
    with running(make_app()) as url:
        config = DedupConfig(semantic=SemanticConfig(url=url, model="stub", candidate_cosine=0.3,
                                                     flag_cosine=0.8))
        stub, outcome = decontaminate(tasks, index, config)
    out["stub_embeddings"] = score(stub) | {"status": outcome.status, "flag_cosine": 0.8, "candidate_cosine": 0.3}
    return out


def large_section(config: DedupConfig, quick: bool) -> dict:
    """100k tasks vs 1M reference documents through the persisted index, with planted leaks."""
    n_ref, n_tasks = (100_000, 10_000) if quick else (1_000_000, 100_000)
    log(f"decontamination: {n_tasks} tasks vs {n_ref} reference documents")
    c = Corpus(11)
    with tempfile.TemporaryDirectory() as tmp:
        ref = ReferenceIndex(Path(tmp) / "index", config.index_config)
        t = time.perf_counter()

        def stream():
            for start in range(0, n_ref, 50_000):
                block = c.words(min(50_000, n_ref - start))
                for i, row in enumerate(block):
                    yield CorpusDoc("synthetic", f"ref-{start + i}", c.text(row))

        ref.add(stream(), progress=lambda k: log(f"  indexed {k}") if k % 200_000 == 0 else None)
        ref.save()
        build_s = time.perf_counter() - t
        disk_mb = sum(p.stat().st_size for p in (Path(tmp) / "index").iterdir()) / 2 ** 20
        task_words = c.words(n_tasks)
        leaked = min(1000, n_tasks // 100)
        texts = [c.text(row) for row in task_words]
        src = ref.docs().slice(0, 2 * leaked).column("text").to_pylist()
        # Planted leaks: the first `leaked` tasks are light edits of reference documents; the
        # next `leaked` hold a 30-word excerpt of one inside otherwise unrelated text.
        for i in range(leaked):
            w = src[i].split()
            w[i % 50] = "edited"
            texts[i] = " ".join(w)
            excerpt = src[leaked + i].split()[60:90]
            own = texts[leaked + i].split()
            texts[leaked + i] = " ".join(own[:80] + excerpt + own[80:])
        t = time.perf_counter()
        found = ref.search(texts, config)
        search_s = time.perf_counter() - t
        flagged = {cand.query for cand in found if cand.match.flagged}
        by_lsh = {cand.query for cand in found if cand.match.flagged and "lsh" in cand.proposed_by}
    edits, excerpts = set(range(leaked)), set(range(leaked, 2 * leaked))
    return {
        "reference_docs": n_ref, "tasks": n_tasks, "index_build_s": round(build_s, 1),
        "search_s": round(search_s, 1), "total_s": round(build_s + search_s, 1),
        "tasks_per_s": round(n_tasks / search_s, 1), "index_disk_mb": round(disk_mb, 1),
        "ngram_postings": ref.ngrams.size, "windows": int(ref.bands.size),
        "planted_light_edits": leaked, "light_edits_found": len(flagged & edits),
        "planted_excerpts": leaked, "excerpts_found": len(flagged & excerpts),
        "excerpts_lsh_would_find": len(by_lsh & excerpts),
        "false_flags": len(flagged - edits - excerpts),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    ap.add_argument("--skip-large", action="store_true", help="skip the 100k x 1M decontamination timing")
    ap.add_argument("--skip-recall", action="store_true", help="skip the HumanEval recall / clean-task section")
    ap.add_argument("--skip-signatures", action="store_true", help="skip the MinHash/LSH section")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    config = DedupConfig()
    result: dict = {"load_average_at_start": list(os.getloadavg()), "cpus": os.cpu_count()}
    if not args.skip_signatures:
        result["signatures"] = signature_section(config, args.quick)
    if not args.skip_recall:
        result["recall"] = recall_section(args.quick)
    if not args.skip_large:
        result["decontamination"] = large_section(config, args.quick)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


def signature_section(config: DedupConfig, quick: bool) -> dict:
    """MinHash vs datasketch, estimate agreement and LSH on synthetic documents."""
    n_docs, planted = (2_000, 200) if quick else (20_000, 2_000)
    hasher = config.hasher()
    bands, rows = config.banding()
    result: dict = {"docs": n_docs, "planted_pairs": planted, "num_perm": config.index_config.num_perm,
                    "threshold": config.threshold, "bands": bands, "rows": rows}
    log(f"generating {n_docs} documents")
    docs, pairs = make_docs(n_docs, planted, seed=7)
    # Every path is timed from the same raw text to signatures: tokenising and shingling are
    # part of the job. datasketch's bulk rate on pre-shingled input is reported beside it.
    log("datasketch update loop (sample)")
    loop_rate = time_update_loop(docs, 300 if not quick else 100)
    log("datasketch bulk (defaults)")
    bulk_rate, bulk_preshingled_rate, bulk_mhs = time_bulk(docs)
    log("datasketch bulk with xxh32 vs envforge, alternating")
    xxh_rates, xxh_pre, ours = [], [], []
    for _ in range(5):
        rate, pre, _ = time_bulk(docs, hashfunc=xxhash.xxh32_intdigest)
        xxh_rates.append(rate)
        xxh_pre.append(pre)
        rate, sigs = time_envforge(config, docs)
        ours.append(rate)
    ours_rate, xxh_rate = statistics.median(ours), statistics.median(xxh_rates)
    result.update({
        "signatures_per_s_update_loop": round(loop_rate, 1), "signatures_per_s_bulk": round(bulk_rate, 1),
        "signatures_per_s_bulk_xxh32": round(xxh_rate, 1),
        "signatures_per_s_bulk_xxh32_preshingled": round(statistics.median(xxh_pre), 1),
        "signatures_per_s_envforge": round(ours_rate, 1),
        "signatures_per_s_envforge_runs": [round(r, 1) for r in ours],
        "signatures_per_s_bulk_xxh32_runs": [round(r, 1) for r in xxh_rates],
        "signatures_per_s_bulk_preshingled": round(bulk_preshingled_rate, 1),
        "ratio_vs_update_loop": round(ours_rate / loop_rate, 1), "ratio_vs_bulk": round(ours_rate / bulk_rate, 2),
        "ratio_vs_bulk_xxh32": round(ours_rate / xxh_rate, 2),
    })

    log("estimate agreement on planted pairs")
    exact, ours, theirs = [], [], []
    for a, b in pairs:
        exact.append(exact_jaccard(hasher.shingle_hashes(docs[a]), hasher.shingle_hashes(docs[b])))
        ours.append(float(np.mean(sigs[a] == sigs[b])))
        theirs.append(bulk_mhs[a].jaccard(bulk_mhs[b]))
    exact_a, ours_a, theirs_a = map(np.array, (exact, ours, theirs))
    sampling_sd = np.sqrt(exact_a * (1 - exact_a) / config.index_config.num_perm)
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
            config.threshold, config.index_config.num_perm, (0.5, 0.5))),
    })
    b5, r5 = result["default_weights_banding"]
    result["recall_at_threshold_default_weights_model"] = round(
        statistics.mean(collision_probability(exact_by_pair[p], b5, r5) for p in at_t), 4) if at_t else None
    result["recall_at_threshold_recall_weights_model"] = round(
        statistics.mean(collision_probability(exact_by_pair[p], bands, rows) for p in at_t), 4) if at_t else None
    return result


if __name__ == "__main__":
    main()
