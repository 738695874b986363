"""The optional semantic stage: paraphrases that share no run of words with their source.

n-gram and MinHash checks let rephrased benchmark items through (Yang et al. 2023,
"Rethinking Benchmark and Contamination for Language Models with Rephrased Samples"); they
close the gap with embedding retrieval and an LLM judge. Here:
1. reference documents are embedded once through an OpenAI-compatible `/v1/embeddings`
   endpoint (vLLM, TEI and most servers speak it) and stored beside the index, per model.
   What is embedded is a text's prose (`code.semantic_text`): a benchmark item's docstring
   and a task's wording, not the code and tests around them, which would drown the meaning;
2. each task field in `SemanticConfig.fields` is embedded and its `top_k` nearest reference
   documents (cosine) at or above `candidate_cosine` are candidates;
3. with a judge, each candidate is judged by a chat model through the client the rollouts use
   (`OpenAIChatPolicy.request`), with a versioned prompt; the verdict and rationale are kept.
   Without one, a candidate at or above `flag_cosine` counts as a paraphrase.

An endpoint that does not answer never turns into "clean": the outcome says the stage was
unavailable, the verdicts say they come from the exact stages only, and with
`required=True` the run fails instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from envforge.errors import EnvforgeError
from envforge.quality.code import semantic_text
from envforge.quality.params import SemanticConfig
from envforge.rollout.policies.base import PolicyError
from envforge.rollout.policies.openai_client import OpenAIChatPolicy, parse_chat_response
from envforge.safefs import atomic_writer, write_atomic

JUDGE_PROMPT_VERSION = "contamination-judge/1"
JUDGE_SYSTEM = (
    "You check whether a training task was derived from a benchmark problem. A task is "
    "contaminated if it asks for the same problem as the benchmark item, even when reworded, "
    "renamed, translated or reordered; it is clean if it is a different problem, even on a similar "
    "topic. Answer with one JSON object and nothing else: "
    '{"verdict": "contaminated" | "clean", "rationale": "<one or two sentences>"}'
)
JUDGE_USER = "Benchmark item ({corpus}/{doc_id}):\n<<<\n{reference}\n>>>\n\nTask text ({field}):\n<<<\n{task}\n>>>"


@dataclass(frozen=True)
class SemanticHit:
    query: int
    corpus: str
    doc_id: str
    cosine: float
    flagged: bool
    decided_by: str  # judge | cosine
    judge: dict | None = None  # verdict, rationale, model, prompt_version

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class SemanticOutcome:
    status: str = "off"  # off | ok | unavailable | judge unavailable
    error: str = ""
    model: str = ""
    judge_model: str = ""
    prompt_version: str = ""
    hits: list[SemanticHit] = field(default_factory=list)
    embedded_docs: int = 0

    def note(self) -> str:
        """What a verdict must say about this stage ("" when it ran as configured, or is off)."""
        if self.status == "unavailable":
            return f"semantic stage unavailable ({self.error}); decided by the exact stages only"
        if self.status == "judge unavailable":
            return f"judge unavailable ({self.error}); semantic candidates decided by cosine"
        return ""

    def as_dict(self) -> dict:
        return {
            "status": self.status,
            "error": self.error,
            "model": self.model,
            "judge_model": self.judge_model,
            "prompt_version": self.prompt_version,
            "hits": len(self.hits),
            "embedded_docs": self.embedded_docs,
        }


def _client(url: str, model: str, config: SemanticConfig) -> OpenAIChatPolicy:
    return OpenAIChatPolicy(
        url,
        model,
        api_key=os.environ.get(config.api_key_env) or None,
        timeout_s=config.timeout_s,
        max_retries=config.max_retries,
        backoff_s=0.2,
    )


async def embed(client: OpenAIChatPolicy, texts: Sequence[str], config: SemanticConfig) -> np.ndarray:
    """(n, dim) float32 unit vectors for `texts`, in batches of `batch_size`."""
    out: list[np.ndarray] = []
    for start in range(0, len(texts), config.batch_size):
        chunk = [t[: config.max_chars] or " " for t in texts[start : start + config.batch_size]]
        body = await client.request("/embeddings", {"model": config.model, "input": chunk})
        try:
            data = sorted(body["data"], key=lambda d: d["index"])
            vecs = np.asarray([d["embedding"] for d in data], dtype=np.float32)
        except (KeyError, TypeError, ValueError) as exc:
            raise PolicyError(f"embeddings response is not OpenAI-shaped ({exc}): {str(body)[:300]}") from None
        if vecs.ndim != 2 or len(vecs) != len(chunk):
            raise PolicyError(f"embeddings response has {len(vecs)} vectors for {len(chunk)} inputs")
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        out.append(vecs / np.where(norms == 0, 1, norms))
    return np.concatenate(out) if out else np.zeros((0, 0), np.float32)


class EmbeddingStore:
    """Reference-document embeddings of one model, beside the index, grown incrementally."""

    def __init__(self, index_root: Path, model: str) -> None:
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model)[:80] or "model"
        self.vectors_path = Path(index_root) / "embeddings" / f"{slug}.npy"
        self.meta_path = self.vectors_path.with_suffix(".json")
        self.model = model

    def load(self, build_id: str) -> np.ndarray:
        """The stored vectors, if they belong to this model and this build of the index."""
        if not self.vectors_path.exists() or not self.meta_path.exists():
            return np.zeros((0, 0), np.float32)
        meta = json.loads(self.meta_path.read_text())
        if meta.get("model") != self.model or meta.get("build_id") != build_id:
            return np.zeros((0, 0), np.float32)
        return np.load(self.vectors_path)

    def save(self, vectors: np.ndarray, build_id: str) -> None:
        self.vectors_path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_writer(self.vectors_path) as fh:
            np.save(fh, vectors)
        write_atomic(self.meta_path, json.dumps({"model": self.model, "documents": len(vectors), "build_id": build_id}))


def _parse_verdict(text: str) -> dict | None:
    m = re.search(r"\{.*\}", text, re.DOTALL)
    if not m:
        return None
    try:
        data = json.loads(m.group())
    except ValueError:
        return None
    verdict = str(data.get("verdict", "")).strip().lower()
    if verdict not in ("contaminated", "clean"):
        return None
    return {"verdict": verdict, "rationale": str(data.get("rationale", ""))[:1000]}


async def judge(
    client: OpenAIChatPolicy,
    field_name: str,
    task_text: str,
    corpus: str,
    doc_id: str,
    reference: str,
    config: SemanticConfig,
) -> dict:
    """The judge's verdict on one candidate: {verdict, rationale, raw (when unparseable)}."""
    user = JUDGE_USER.format(
        corpus=corpus,
        doc_id=doc_id,
        reference=reference[: config.max_chars],
        field=field_name,
        task=task_text[: config.max_chars],
    )
    payload = {
        "model": client.model,
        "messages": [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}],
        "temperature": 0.0,
        "max_tokens": 300,
        "seed": 0,
    }
    out = parse_chat_response(await client.request("/chat/completions", payload))
    verdict = _parse_verdict(out.text)
    return verdict if verdict is not None else {"verdict": "unparseable", "rationale": "", "raw": out.text[:500]}


def run_semantic(
    index, texts: Sequence[str], fields: Sequence[str], config: SemanticConfig, corpora: set[str] | None = None
) -> SemanticOutcome:
    """Retrieve (and judge) reference documents for each text (its field name in `fields`)."""
    outcome = SemanticOutcome(
        status="ok",
        model=config.model,
        judge_model=config.judge_model,
        prompt_version=JUDGE_PROMPT_VERSION if config.judge_url else "",
    )
    try:
        asyncio.run(_run(index, texts, fields, config, corpora, outcome))
    except PolicyError as exc:
        if config.required:
            raise EnvforgeError(f"semantic stage: embeddings endpoint {config.url} unavailable: {exc}") from exc
        outcome.status, outcome.error, outcome.hits = "unavailable", f"{config.url}: {exc}", []
    return outcome


async def _run(
    index,
    texts: Sequence[str],
    fields: Sequence[str],
    config: SemanticConfig,
    corpora: set[str] | None,
    outcome: SemanticOutcome,
) -> None:
    client = _client(config.url, config.model, config)
    judge_client = _client(config.judge_url, config.judge_model, config) if config.judge_url else None
    try:
        store = EmbeddingStore(index.root, config.model)
        vectors = store.load(index.build_id)  # documents are only ever appended within one build
        docs = index.docs()
        if len(vectors) < index.documents:
            todo = [semantic_text(t) for t in docs.slice(len(vectors)).column("text").to_pylist()]
            new = await embed(client, todo, config)
            vectors = new if len(vectors) == 0 else np.concatenate([vectors, new])
            store.save(vectors, index.build_id)
        outcome.embedded_docs = len(vectors)
        if not len(texts) or not len(vectors):
            return
        q = await embed(client, [semantic_text(t) for t in texts], config)
        usable = index.live.copy()
        if corpora is not None:
            usable &= np.isin(np.asarray(docs.column("corpus").to_pylist()), list(corpora))
        sims = q @ vectors.T
        sims[:, ~usable] = -1.0
        corpus_col, id_col, text_col = docs.column("corpus"), docs.column("doc_id"), docs.column("text")
        judge_down = ""
        for i in range(len(texts)):
            order = np.argsort(-sims[i])[: config.top_k]
            for d in order.tolist():
                cos = float(sims[i, d])
                if cos < config.candidate_cosine:
                    break
                corpus, doc_id = corpus_col[d].as_py(), id_col[d].as_py()
                verdict = None
                if judge_client is not None and not judge_down:
                    try:
                        verdict = await judge(
                            judge_client, fields[i], texts[i], corpus, doc_id, text_col[d].as_py(), config
                        )
                        verdict.update(model=config.judge_model, prompt_version=JUDGE_PROMPT_VERSION)
                    except PolicyError as exc:
                        judge_down = f"{config.judge_url}: {exc}"
                if verdict is not None and verdict["verdict"] != "unparseable":
                    hit = SemanticHit(
                        i, corpus, doc_id, round(cos, 4), verdict["verdict"] == "contaminated", "judge", verdict
                    )
                else:
                    hit = SemanticHit(i, corpus, doc_id, round(cos, 4), cos >= config.flag_cosine, "cosine", verdict)
                outcome.hits.append(hit)
        if judge_down:
            if config.required:
                raise EnvforgeError(f"semantic stage: judge unavailable: {judge_down}")
            outcome.status, outcome.error = "judge unavailable", judge_down
    finally:
        await client.aclose()
        if judge_client is not None:
            await judge_client.aclose()
