"""The settings of the statement check (ingest's `statements` policy and the optional model review).

Kept apart from the rules so the stage configs, which the CLI reads at start-up, import nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

STATEMENT_POLICIES = ("strict", "flag", "off")


@dataclass(frozen=True)
class StatementReviewConfig:
    """The optional model-assisted review of task statements (after the deterministic rules): a rubric
    like SWE-bench Verified's through any OpenAI-compatible endpoint. Off unless `url` is set."""

    url: str = field(
        default="",
        metadata={
            "help": "OpenAI-compatible base URL ending in /v1 (envforge policy serve, "
            "vLLM, a hosted API); empty: no model review"
        },
    )
    model: str = field(default="", metadata={"help": "model name sent to the endpoint"})
    api_key_env: str = field(
        default="ENVFORGE_REVIEW_API_KEY",
        metadata={"help": "environment variable holding the endpoint's API key, if it needs one"},
    )
    rewrite: bool = field(
        default=False,
        metadata={
            "help": "also ask for a rewritten statement; it replaces the task's only if it passes the deterministic "
            "leak and underspecification rules"
        },
    )
    enforce: bool = field(
        default=False,
        metadata={"help": "with statements=strict, keep out tasks the model rates 2 or worse on either rubric axis"},
    )
    concurrency: int = field(default=4, metadata={"help": "review requests in flight"})
    timeout_s: float = field(default=120.0, metadata={"help": "seconds per request"})
    max_chars: int = field(default=6000, metadata={"help": "characters of the statement, tests and reference sent"})

    def __post_init__(self) -> None:
        if self.url and not self.model:
            raise ValueError("StatementReviewConfig.model: the review needs a model name with its url")
        if self.concurrency < 1:
            raise ValueError(f"StatementReviewConfig.concurrency: must be at least 1, got {self.concurrency}")
