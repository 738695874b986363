"""The optional model review of statements, through the real OpenAI client path against local servers.

What these tests prove, and what they do not: the stub server below answers the rubric from simple
rules, so the tests show the request, the parsing, the rewrite gate (a leaking rewrite is refused by
the deterministic rules), the agreement bookkeeping, `enforce` and the endpoint-down fallback, all
over real HTTP. The last test sends the same requests to `envforge policy serve` on a tiny untrained
model: the server and client speak to each other and a reply that is not a rating is recorded as
`unparseable`, never as a verdict. Neither says anything about how well a real model rates statements;
that needs a real model (docs/sources.md says how to point the review at one).
"""

from __future__ import annotations

import json
import re

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from envforge.quality.statement_config import StatementReviewConfig
from envforge.quality.statement_policy import apply_statement_policy
from envforge.quality.statement_review import parse_review
from tests.serving import free_port, running_server
from tests.test_statements import LEAKY, THIN, WORKSPACE, _Reader, task

GOOD_REWRITE = ("Calling args2sh with a separator fails: it takes no way to choose one, so command lines for "
                "other shells come out wrong. It should accept the separator to join with.")


def stub_reviewer() -> FastAPI:
    """Rates a statement 3 (underspecified) when it has fewer than 12 words, else 0; rewrites on request,
    leaking the hidden test name for statements that mention 'separator' in their title line."""
    app = FastAPI()
    app.state.requests = []

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        app.state.requests.append(body)
        user = body["messages"][-1]["content"]
        statement = user.split("STATEMENT:\n<<<\n", 1)[1].split("\n>>>", 1)[0]
        words = len(re.findall(r"\w+", statement))
        answer = {"underspecified": 3 if words < 12 else 0, "test_validity": 1, "rationale": f"{words} words"}
        if "rewrite" in body["messages"][0]["content"]:
            answer["rewrite"] = GOOD_REWRITE if words >= 12 else "args2sh needs sep; see test_args2sh_sep."
        content = "Here is my review:\n```json\n" + json.dumps(answer) + "\n```"
        return JSONResponse({"id": "x", "object": "chat.completion", "model": body["model"],
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": content}}]})

    return app


def test_parse_review_takes_the_json_object_and_refuses_out_of_range_scores():
    assert parse_review('ok {"underspecified": 1, "test_validity": 0, "rationale": "fine"}') == \
        {"underspecified": 1, "test_validity": 0, "rationale": "fine", "rewrite": ""}
    assert parse_review('{"underspecified": 4, "test_validity": 0}') is None
    assert parse_review('{"underspecified": true, "test_validity": 0}') is None
    assert parse_review("the statement is fine") is None


def test_the_review_rates_rewrites_and_reports_its_agreement_with_the_rules():
    app = stub_reviewer()
    with running_server(app) as base:
        config = StatementReviewConfig(url=f"{base}/v1", model="stub", rewrite=True)
        thin = task(THIN).model_copy(update={"spec": task(THIN).spec.model_copy(update={"metadata": {}})})
        out = apply_statement_policy([task(LEAKY), thin.model_copy(update={"spec": thin.spec.model_copy(
            update={"id": "shellargs-c-4"})})], "flag", reader=_Reader(), review=config)
    assert out.review.status == "ok" and len(app.state.requests) == 2
    # the model saw the repaired statement, not the leaky one
    assert all("test_args2sh_sep" not in r["messages"][-1]["content"].split("TESTS")[0] for r in app.state.requests)
    by_id = {t.id: t for t in out.tasks}
    repaired = by_id["shellargs-c-3"].spec.metadata["statement"]["review"]
    assert repaired["status"] == "ok" and repaired["underspecified"] == 0 and repaired["rewrite_accepted"]
    assert by_id["shellargs-c-3"].spec.instruction == GOOD_REWRITE
    thin_review = by_id["shellargs-c-4"].spec.metadata["statement"]["review"]
    assert thin_review["bad"] and not thin_review["rewrite_accepted"]
    assert any(f.startswith("leak.test_name") for f in thin_review["rewrite_findings"])
    assert by_id["shellargs-c-4"].spec.instruction == THIN.removeprefix("Ticket c-4: ")  # the refused rewrite is not used
    assert out.review.agreement == {"both_bad": 1, "both_ok": 1} and out.review.agreement_rate() == 1.0


def test_enforce_keeps_out_what_the_model_rates_unusable_under_strict():
    with running_server(stub_reviewer()) as base:
        config = StatementReviewConfig(url=f"{base}/v1", model="stub", enforce=True)
        fine_by_rules = task("Ticket c-5: args2sh ignores separators\n\nIts output is wrong for cmd.exe.")
        fine_by_rules = fine_by_rules.model_copy(update={"spec": fine_by_rules.spec.model_copy(update={"metadata": {}})})
        out = apply_statement_policy([fine_by_rules], "strict", reader=_Reader(), review=config)
    assert out.checks["shellargs-c-3"].verdict == "repaired"  # only the prefix went: the rules pass it
    assert out.tasks == [] and out.rejects[0].field == "instruction"
    assert "model review: underspecified 3/3" in out.rejects[0].reason


def test_an_endpoint_that_does_not_answer_leaves_the_rules_verdicts():
    config = StatementReviewConfig(url=f"http://127.0.0.1:{free_port()}/v1", model="m", timeout_s=2)
    out = apply_statement_policy([task(LEAKY)], "flag", reader=_Reader(), review=config)
    assert out.review.status == "unavailable" and "127.0.0.1" in out.review.error
    [kept] = out.tasks
    assert kept.spec.metadata["statement"]["verdict"] == "repaired" and "review" not in kept.spec.metadata["statement"]


@pytest.mark.slow
def test_the_review_runs_against_envforge_policy_serve(tmp_path):
    """A real OpenAI-compatible server (a tiny untrained model): its replies are not ratings, and are
    recorded as unparseable rather than read as verdicts."""
    from envforge.rollout.policies.hf import HFPolicy
    from envforge.rollout.policies.serve import make_app
    from envforge.rollout.policies.tiny import TinyModelConfig, build_tiny_model, save_pretrained_dir

    model, tok = build_tiny_model(TinyModelConfig(seed=0))
    with running_server(make_app(HFPolicy(save_pretrained_dir(model, tok, tmp_path / "tiny")))) as base:
        config = StatementReviewConfig(url=f"{base}/v1", model="tiny", max_chars=400)
        out = apply_statement_policy([task(LEAKY)], "flag", reader=_Reader(), review=config)
    assert out.review.status == "ok"
    review = out.tasks[0].spec.metadata["statement"]["review"]
    assert review["status"] in ("unparseable", "ok") and review["prompt_version"] == "statement-review/1"
    if review["status"] == "unparseable":
        assert out.review.agreement == {"no_rating": 1} and review["bad"] is None


def test_workspace_fixture_is_the_pre_fix_code():
    assert "sep" not in WORKSPACE[0][1]
