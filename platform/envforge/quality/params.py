"""The dedup/decontamination parameters, as typed objects (part of a task-set version).

Two kinds of parameters, kept apart so that changing a decision never means rebuilding:
- `IndexConfig`: how the persisted reference index is built (shingles, permutations, LSH
  banding, n-gram fingerprints). Changing one means `envforge dedup index --rebuild`.
- `DedupConfig`: how candidates are decided (thresholds, run lengths), what of a task is
  compared (`WorkspaceScan`), task-vs-task boilerplate, and the optional semantic stage.
  These apply at query time and can change from one run to the next.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING

from envforge.config import config_from_dict

if TYPE_CHECKING:  # kept light: the CLI reads these classes' help texts at start-up
    from envforge.quality.minhash import MinHasher

# LSH banding weights (false positives, false negatives): recall first, every candidate is confirmed.
RECALL_WEIGHTS = (0.1, 0.9)


def _help(text: str, default):
    return field(default=default, metadata={"help": text})


@dataclass(frozen=True)
class IndexConfig:
    """What the reference index is built with; an index built otherwise refuses to open."""

    num_perm: int = _help("MinHash permutations", 128)
    ngram: int = _help("word n-gram shingles for MinHash and exact Jaccard", 5)
    char_ngram: int = _help("character n-grams for texts under short_words words", 5)
    short_words: int = _help("texts with fewer words use character shingles and the short run rule", 20)
    window_words: int = _help(
        "texts are compared in half-overlapping windows of this many words "
        "(containment: a task copied into a longer document still matches)",
        100,
    )
    candidate_threshold: float = _help(
        "Jaccard the LSH banding is tuned for; lower it to propose more pairs below the decision threshold", 0.5
    )
    fp_weight: float = _help("LSH banding weight of false positives (recall-weighted by default)", RECALL_WEIGHTS[0])
    fn_weight: float = _help("LSH banding weight of false negatives", RECALL_WEIGHTS[1])
    seed: int = _help("hash seed", 1)
    index_ngram: int = _help("n of the exact word n-gram index", 8)
    guaranteed_run: int = _help(
        "a shared run of at least this many words (or masked prose words) always "
        "becomes a candidate (winnowing window = guaranteed_run - index_ngram + 1)",
        13,
    )
    code_index_ngram: int = _help("n of the exact n-gram index over normalized code tokens", 12)
    code_guaranteed_run: int = _help(
        "a shared run of at least this many normalized code tokens always becomes a candidate", 40
    )
    max_df: int = _help("an n-gram in more reference documents than this is boilerplate and proposes nothing", 100)

    def __post_init__(self) -> None:
        if not 0.0 < self.candidate_threshold < 1.0:
            raise ValueError(f"candidate_threshold {self.candidate_threshold} must be in (0, 1)")
        if self.guaranteed_run < self.index_ngram:
            raise ValueError(f"guaranteed_run {self.guaranteed_run} must be >= index_ngram {self.index_ngram}")
        if self.code_guaranteed_run < self.code_index_ngram:
            raise ValueError(
                f"code_guaranteed_run {self.code_guaranteed_run} must be >= code_index_ngram {self.code_index_ngram}"
            )

    def hasher(self) -> "MinHasher":
        from envforge.quality.minhash import MinHasher

        return MinHasher(self.num_perm, self.ngram, self.char_ngram, self.short_words, self.seed)

    def banding(self) -> tuple[int, int]:
        from envforge.quality.lsh import banding

        return banding(self.candidate_threshold, self.num_perm, (self.fp_weight, self.fn_weight))

    def differences(self, other: "IndexConfig") -> dict[str, tuple]:
        """{parameter: (this, other)} for every parameter that differs."""
        return {
            f.name: (getattr(self, f.name), getattr(other, f.name))
            for f in fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        }

    def cli_flags(self) -> str:
        """The `envforge dedup index --rebuild` options that rebuild an index with these parameters."""
        default = IndexConfig()
        return " ".join(f"--{name.replace('_', '-')} {mine}" for name, (mine, _) in self.differences(default).items())


@dataclass(frozen=True)
class WorkspaceScan:
    """What of a task's workspace is read; everything left out is counted and named."""

    max_file_bytes: int = _help(
        "bytes read per file; a longer file is read up to here and reported truncated", 256 * 1024
    )
    max_files: int = _help("files read per workspace; the rest are reported skipped", 5000)
    max_total_bytes: int = _help("bytes read per workspace; the rest are reported skipped", 32 * 1024 * 1024)
    skip_dirs: tuple[str, ...] = _help(
        "directory names never read (vendored, generated, caches)",
        (
            ".git",
            "node_modules",
            "vendor",
            "third_party",
            "third-party",
            "site-packages",
            ".venv",
            "venv",
            "__pycache__",
            ".tox",
            ".mypy_cache",
            ".pytest_cache",
            "dist",
            "build",
            ".eggs",
            "bower_components",
        ),
    )
    skip_suffixes: tuple[str, ...] = _help(
        "file endings never read (lock files, minified and compiled files, archives, media)",
        (
            ".lock",
            "-lock.json",
            ".min.js",
            ".min.css",
            ".map",
            ".pyc",
            ".so",
            ".o",
            ".a",
            ".dll",
            ".exe",
            ".class",
            ".jar",
            ".zip",
            ".gz",
            ".tgz",
            ".bz2",
            ".xz",
            ".7z",
            ".png",
            ".jpg",
            ".jpeg",
            ".gif",
            ".ico",
            ".pdf",
            ".woff",
            ".woff2",
            ".ttf",
            ".parquet",
            ".npy",
            ".npz",
            ".pt",
            ".safetensors",
        ),
    )


@dataclass(frozen=True)
class SemanticConfig:
    """The optional paraphrase stage: embedding retrieval, then optionally an LLM judge."""

    url: str = _help(
        "OpenAI-compatible base URL of the embeddings server, ending in /v1; setting it turns the "
        "semantic stage on (empty: off)",
        "",
    )
    model: str = _help("embedding model name sent to the server", "")
    api_key_env: str = _help(
        "environment variable holding the API key, if the server needs one", "ENVFORGE_EMBEDDINGS_API_KEY"
    )
    top_k: int = _help("reference documents retrieved per task field", 3)
    candidate_cosine: float = _help("cosine similarity from which a retrieved document is a candidate", 0.8)
    flag_cosine: float = _help(
        "without a judge (or when it is down), cosine from which a candidate counts as a paraphrase", 0.92
    )
    judge_url: str = _help("OpenAI-compatible base URL of the judge model (empty: no judge)", "")
    judge_model: str = _help("judge model name", "")
    fields: tuple[str, ...] = _help("task fields embedded and compared", ("instruction", "solution", "tests"))
    max_chars: int = _help("characters of each text sent to the embedding model", 4000)
    batch_size: int = _help("texts per embeddings request", 64)
    timeout_s: float = _help("seconds per request", 30.0)
    max_retries: int = _help("retries per request before the endpoint counts as down", 2)
    required: bool = _help("fail the run instead of falling back to the exact stages when an endpoint is down", False)

    def __post_init__(self) -> None:
        if self.url and not self.model:
            raise ValueError("the semantic stage needs an embedding model with its url")
        if self.judge_url and not self.judge_model:
            raise ValueError("a judge url needs a judge model")

    @property
    def enabled(self) -> bool:
        return bool(self.url)


@dataclass(frozen=True)
class DedupConfig:
    """Decision rules and what is compared; `index` is what the reference index is built with."""

    threshold: float = _help("exact Jaccard (best window pair) at or above which texts are near duplicates", 0.5)
    verbatim_ngram: int = _help("a shared run of this many words (or masked prose words) is a verbatim leak", 13)
    verbatim_ngram_short: int = _help("the same when either text is short", 8)
    code_run: int = _help(
        "a shared run of this many normalized code tokens (identifiers and strings "
        "canonicalized) is a leak of renamed code",
        50,
    )
    min_distinct_run_tokens: int = _help(
        "a shared run counts only with at least this many distinct tokens besides "
        "masked names and punctuation, and not a counting sequence",
        3,
    )
    boilerplate_min_tasks: int = _help(
        "task-vs-task dedup: a shingle found in at least this many tasks is "
        "boilerplate (a template intro, a license header) and is ignored",
        5,
    )
    dedup_containment: float = _help(
        "task-vs-task dedup: also duplicates when this share of the smaller "
        "task's own (non-boilerplate) shingles is in the other",
        0.8,
    )
    dedup_distinct_words: int = _help(
        "task-vs-task dedup: two tasks that each hold a run of this many words found "
        "nowhere in the other are different tasks, whatever they share (a template "
        "intro both start with)",
        8,
    )
    index: IndexConfig | None = field(
        default=None,
        metadata={"help": "reference index parameters (None: those the index on disk was built with)", "option": False},
    )  # `envforge dedup index` sets them
    workspace: WorkspaceScan = field(default_factory=WorkspaceScan, metadata={"help": "workspace scanning"})
    semantic: SemanticConfig = field(default_factory=SemanticConfig, metadata={"help": "semantic stage"})

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold {self.threshold} must be in (0, 1]")
        if not 0.0 < self.dedup_containment <= 1.0:
            raise ValueError(f"dedup_containment {self.dedup_containment} must be in (0, 1]")

    @property
    def index_config(self) -> IndexConfig:
        return self.index or IndexConfig()

    def hasher(self) -> "MinHasher":
        return self.index_config.hasher()

    def banding(self) -> tuple[int, int]:
        return self.index_config.banding()

    def with_index(self, index: IndexConfig) -> "DedupConfig":
        from dataclasses import replace

        return replace(self, index=index)

    def as_params(self) -> dict:
        """{"dedup": every field}, JSON-shaped (tuples as lists), so it equals itself read back from a
        catalog or Dagster metadata; `from_params` builds the config again."""
        return {"dedup": json.loads(json.dumps(asdict(self)))}

    @classmethod
    def from_params(cls, params: dict) -> "DedupConfig":
        """The config `as_params()["dedup"]` recorded (nested configs and tuples back from JSON). A task set
        recorded before the index parameters had their own object keeps its decision rules; the index
        parameters then are the defaults."""
        return config_from_dict(cls, params)

    def index_warnings(self) -> list[str]:
        """Where the decision rules ask for more than the index guarantees to propose."""
        out = []
        ix = self.index_config
        if self.threshold < ix.candidate_threshold:
            out.append(
                f"threshold {self.threshold} is below the LSH band's {ix.candidate_threshold}: pairs between "
                f"them become candidates only through shared runs; rebuild with `envforge dedup index "
                f"--rebuild --candidate-threshold {self.threshold}` to propose them by Jaccard too"
            )
        if self.verbatim_ngram < ix.guaranteed_run:
            out.append(
                f"verbatim_ngram {self.verbatim_ngram} is below the index's guaranteed run "
                f"{ix.guaranteed_run}: shorter shared runs are found only by chance; rebuild with "
                f"`envforge dedup index --rebuild --guaranteed-run {self.verbatim_ngram}`"
            )
        if self.code_run < ix.code_guaranteed_run:
            out.append(f"code_run {self.code_run} is below the index's guaranteed code run {ix.code_guaranteed_run}")
        return out
