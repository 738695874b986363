"""When the client tries a request again: the service said "later" (429 quota, 503 full) or could not
be reached. Bounded by attempts and by total time; the service's `Retry-After` is the wait when it
sends one, else exponential backoff with jitter. Built on tenacity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tenacity

from envforge_client.errors import QuotaExceededError, ServiceUnavailable


@dataclass(frozen=True)
class RetryPolicy:
    """`attempts` tries at most (1: never retry), giving up before a wait that would take the call past
    `max_total_s`: a `Retry-After` longer than what is left is raised at once, for the caller to
    schedule. Backoff without `Retry-After`: `backoff_initial_s` doubling up to `backoff_max_s`, plus jitter."""

    attempts: int = 4
    max_total_s: float = 30.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 8.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts: at least 1 (one try, no retry), got {self.attempts}")
        if self.max_total_s < 0 or self.backoff_initial_s < 0 or self.backoff_max_s < 0:
            raise ValueError("RetryPolicy: max_total_s, backoff_initial_s and backoff_max_s cannot be negative")

    @classmethod
    def never(cls) -> "RetryPolicy":
        return cls(attempts=1)

    def _kwargs(self) -> dict[str, Any]:
        backoff = tenacity.wait_exponential(
            multiplier=self.backoff_initial_s, max=self.backoff_max_s
        ) + tenacity.wait_random(0, self.backoff_initial_s)

        def wait(state: tenacity.RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome is not None else None
            told = getattr(exc, "retry_after_s", None)
            return float(told) if told is not None else float(backoff(state))

        return {
            "stop": tenacity.stop_after_attempt(self.attempts) | tenacity.stop_before_delay(self.max_total_s),
            "wait": wait,
            "retry": tenacity.retry_if_exception(is_retryable),
            "reraise": True,
        }

    def retrying(self) -> tenacity.Retrying:
        return tenacity.Retrying(**self._kwargs())

    def async_retrying(self) -> tenacity.AsyncRetrying:
        return tenacity.AsyncRetrying(**self._kwargs())


def is_retryable(exc: BaseException) -> bool:
    """A quota or a full service answers the same request later; a request that may have run is not repeated."""
    if isinstance(exc, QuotaExceededError):
        return True
    return isinstance(exc, ServiceUnavailable) and not exc.may_have_run
