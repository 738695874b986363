"""The dedup/decontamination parameters, one typed object (part of a task-set version).

Importing it is cheap (numpy and the hashers load when used), so the CLI can build options from it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from envforge.quality.minhash import MinHasher

# LSH banding weights (false positive, false negative): recall first, candidates are confirmed exactly.
RECALL_WEIGHTS = (0.1, 0.9)


@dataclass(frozen=True)
class DedupConfig:
    threshold: float = field(default=0.5, metadata={"help": "exact Jaccard at or above which texts are near duplicates"})
    num_perm: int = field(default=128, metadata={"help": "MinHash permutations"})
    ngram: int = field(default=5, metadata={"help": "word n-gram shingles"})
    char_ngram: int = field(default=5, metadata={"help": "character n-grams for short texts"})
    short_words: int = field(default=20, metadata={"help": "texts with fewer words use character shingles"})
    verbatim_ngram: int = field(default=13, metadata={"help": "a shared word run this long is a verbatim leak"})
    verbatim_ngram_short: int = field(default=8, metadata={"help": "the same for short texts"})
    window_words: int = field(default=100, metadata={"help": "long texts are compared window by window "
                                                             "(containment: a task copied into a longer "
                                                             "benchmark document still matches)"})
    fp_weight: float = field(default=RECALL_WEIGHTS[0], metadata={"help": "LSH banding: weight of false positives"})
    fn_weight: float = field(default=RECALL_WEIGHTS[1], metadata={"help": "LSH banding: weight of false negatives "
                                                                          "(recall first; candidates are confirmed)"})
    seed: int = field(default=1, metadata={"help": "MinHash permutation seed"})

    def hasher(self) -> "MinHasher":
        from envforge.quality.minhash import MinHasher

        return MinHasher(self.num_perm, self.ngram, self.char_ngram, self.short_words, self.seed)

    def banding(self) -> tuple[int, int]:
        from envforge.quality.lsh import banding

        return banding(self.threshold, self.num_perm, (self.fp_weight, self.fn_weight))

    def as_params(self) -> dict:
        return {"dedup": asdict(self)}
