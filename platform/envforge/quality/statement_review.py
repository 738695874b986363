"""Model-assisted review of task statements: the optional second step after the deterministic rules.

SWE-bench Verified had people rate each task on two axes, 0 (fine) to 3 (unusable), and dropped
those rated 2 or worse: is the statement underspecified, and do the tests reject valid solutions.
Here a model does the rating through any OpenAI-compatible endpoint (the client the rollouts
use, with its retries), seeing what the annotators saw: the statement, the hidden test change
and the reference solution. Optionally it rewrites the statement; a rewrite replaces the task's
only if it passes the deterministic leak and underspecification rules (`quality.statements`),
since a model asked to restate a problem next to its solution tends to hand the solution over.

The review never decides alone: each result is recorded beside the deterministic verdict and the
agreement of the two is reported, so a team can see what the model adds before trusting it. An
endpoint that does not answer leaves the deterministic verdicts as they are, and says so.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from envforge.quality.statement_config import StatementReviewConfig
from envforge.quality.statements import StatementContext, check_statement
from envforge.rollout.policies.base import PolicyError
from envforge.rollout.policies.openai_client import OpenAIChatPolicy, parse_chat_response
from envforge.task import Task

PROMPT_VERSION = "statement-review/1"
BAD_SCORE = 2  # as SWE-bench Verified: a task rated 2 or 3 on either axis is dropped
SYSTEM = (
    "You review software-engineering tasks used to train and evaluate coding agents. An agent will see only "
    "the STATEMENT and the repository; the TESTS are hidden and decide success; the REFERENCE is one correct "
    "solution. Rate two things, each 0 to 3.\n"
    "underspecified: 0 = the statement says clearly what is wrong and what a solution must do; 1 = some blanks, "
    "but a sensible interpretation is clear; 2 = vague, room for ambiguity about what a successful solution "
    "looks like; 3 = almost impossible to know what is needed without more information.\n"
    "test_validity: 0 = the tests accept every valid solution of the statement; 1 = they accept most; 2 = they "
    "work, but some perfectly reasonable solutions would fail them (they check names, messages or details the "
    "statement does not ask for); 3 = the tests are too narrow or too broad, or check something else.\n"
    "Answer with one JSON object and nothing else: "
    '{"underspecified": <0-3>, "test_validity": <0-3>, "rationale": "<two sentences at most>"%s}'
)
REWRITE_FIELD = (
    ', "rewrite": "<the statement rewritten as a user would report the problem: what goes wrong '
    'and what is expected, without naming the hidden tests or describing the fix>"'
)
USER = (
    "STATEMENT:\n<<<\n{statement}\n>>>\n\nTESTS (hidden from the agent):\n<<<\n{tests}\n>>>\n\n"
    "REFERENCE (hidden from the agent):\n<<<\n{reference}\n>>>"
)


@dataclass(frozen=True)
class Review:
    """One task's review: the model's scores, or why there are none."""

    status: str  # ok | unparseable | unavailable
    underspecified: int | None = None
    test_validity: int | None = None
    rationale: str = ""
    rewrite: str = ""
    rewrite_accepted: bool = False
    rewrite_findings: tuple[str, ...] = ()  # why a rewrite was refused
    raw: str = ""
    model: str = ""
    prompt_version: str = PROMPT_VERSION

    @property
    def bad(self) -> bool | None:
        """Whether the model rates the task unusable (None: no rating)."""
        if self.status != "ok":
            return None
        return max(self.underspecified or 0, self.test_validity or 0) >= BAD_SCORE

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "rewrite_findings": list(self.rewrite_findings), "bad": self.bad}


def parse_review(text: str) -> dict[str, Any] | None:
    """The JSON object in a model's answer (code fences and surrounding prose tolerated), with both
    scores integers 0-3; None when there is no such object."""
    match = re.search(r"\{.*\}", text, re.S)
    if not match:
        return None
    try:
        data = json.loads(match.group(0))
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    scores = {}
    for key in ("underspecified", "test_validity"):
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 3:
            return None
        scores[key] = int(value)
    rewrite = data.get("rewrite")
    return {
        **scores,
        "rationale": str(data.get("rationale", ""))[:1000],
        "rewrite": rewrite.strip() if isinstance(rewrite, str) else "",
    }


async def review_task(
    client: OpenAIChatPolicy, task: Task, context: StatementContext, config: StatementReviewConfig
) -> Review:
    """The model's rating of one task's statement (and its rewrite, checked by the deterministic rules)."""
    n = config.max_chars
    user = USER.format(
        statement=task.spec.instruction[:n],
        tests=(task.test_patch or "(none)")[:n],
        reference=(task.reference_patch or "(none)")[:n],
    )
    payload = {
        "model": client.model,
        "temperature": 0.0,
        "seed": 0,
        "max_tokens": 700 if config.rewrite else 300,
        "messages": [
            {"role": "system", "content": SYSTEM % (REWRITE_FIELD if config.rewrite else "")},
            {"role": "user", "content": user},
        ],
    }
    out = parse_chat_response(await client.request("/chat/completions", payload))
    parsed = parse_review(out.text)
    if parsed is None:
        return Review("unparseable", raw=out.text[:500], model=config.model)
    review = Review("ok", parsed["underspecified"], parsed["test_validity"], parsed["rationale"], model=config.model)
    if config.rewrite and parsed["rewrite"]:
        findings = check_statement(parsed["rewrite"], context)
        review = Review(
            "ok",
            review.underspecified,
            review.test_validity,
            review.rationale,
            parsed["rewrite"],
            not findings,
            tuple(f"{f.rule}: {f.evidence}" for f in findings),
            model=config.model,
        )
    return review


@dataclass
class ReviewOutcome:
    """Every task's review and how the model agrees with the deterministic verdicts."""

    status: str = "off"  # off | ok | unavailable
    error: str = ""
    reviews: dict[str, Review] = field(default_factory=dict)
    agreement: dict[str, int] = field(default_factory=dict)  # both_bad, rules_only, model_only, both_ok, no_rating

    def merge(self, other: "ReviewOutcome") -> None:
        """Fold one source's review into a run's (an unavailable endpoint anywhere is reported)."""
        if other.status == "off":
            return
        if self.status != "unavailable":
            self.status, self.error = other.status, other.error or self.error
        self.reviews.update(other.reviews)
        for key, n in other.agreement.items():
            self.agreement[key] = self.agreement.get(key, 0) + n

    def agreement_rate(self) -> float | None:
        rated = sum(v for k, v in self.agreement.items() if k != "no_rating")
        return (self.agreement.get("both_bad", 0) + self.agreement.get("both_ok", 0)) / rated if rated else None

    def as_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "error": self.error,
            "prompt_version": PROMPT_VERSION,
            "agreement": dict(sorted(self.agreement.items())),
            "agreement_rate": self.agreement_rate(),
            "reviews": {k: v.as_json() for k, v in sorted(self.reviews.items())},
        }


def agreement_cell(rules_flagged: bool, review: Review) -> str:
    if review.bad is None:
        return "no_rating"
    return {
        (True, True): "both_bad",
        (True, False): "rules_only",
        (False, True): "model_only",
        (False, False): "both_ok",
    }[(rules_flagged, review.bad)]


async def _review_all(
    tasks: Sequence[tuple[Task, StatementContext]], config: StatementReviewConfig, outcome: ReviewOutcome
) -> None:
    client = OpenAIChatPolicy(
        config.url,
        config.model,
        api_key=os.environ.get(config.api_key_env) or None,
        timeout_s=config.timeout_s,
        max_retries=2,
    )
    gate = asyncio.Semaphore(config.concurrency)

    async def one(task: Task, context: StatementContext) -> None:
        async with gate:
            if outcome.status == "unavailable":
                return
            try:
                outcome.reviews[task.id] = await review_task(client, task, context, config)
            except PolicyError as exc:  # the endpoint is down or refuses: the rules' verdicts stand
                outcome.status, outcome.error = "unavailable", f"{config.url}: {exc}"[:500]

    try:
        await asyncio.gather(*(one(t, c) for t, c in tasks))
    finally:
        await client.aclose()


def review_statements(
    tasks: Sequence[tuple[Task, StatementContext]], config: StatementReviewConfig, rules_flagged: dict[str, bool]
) -> ReviewOutcome:
    """Review every task (concurrently); `rules_flagged` is the deterministic verdict per task id."""
    outcome = ReviewOutcome()
    if not config.url or not tasks:
        return outcome
    outcome.status = "ok"
    asyncio.run(_review_all(tasks, config, outcome))
    if outcome.status == "unavailable":
        outcome.reviews = {}
        return outcome
    for task, _ in tasks:
        review = outcome.reviews.get(task.id, Review("unavailable", model=config.model))
        cell = agreement_cell(rules_flagged.get(task.id, False), review)
        outcome.agreement[cell] = outcome.agreement.get(cell, 0) + 1
    return outcome


__all__ = ["BAD_SCORE", "PROMPT_VERSION", "Review", "ReviewOutcome", "parse_review", "review_statements", "review_task"]
