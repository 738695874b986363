"""One error type per thing a caller handles differently, read from the service's error answers."""

from __future__ import annotations

import json
import time
from email.utils import parsedate_to_datetime

import httpx


class ServiceError(Exception):
    """Any error answer from the service: `status`, `code` and the service's message."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{message} (HTTP {status}, {code})")
        self.status, self.code, self.message = status, code, message


class AuthenticationError(ServiceError):
    """401: the key is missing, unknown or revoked."""


class NotFoundError(ServiceError):
    """404: no such task set, task or session for this key."""


class SessionLost(ServiceError):
    """The session is gone (the service restarted, it idled out, or an infrastructure fault took its
    sandbox). Not a model failure: start a new session and redo the episode."""


class QuotaExceededError(ServiceError):
    """429: wait `retry_after_s` seconds."""

    def __init__(self, status: int, code: str, message: str, retry_after_s: float):
        super().__init__(status, code, message)
        self.retry_after_s = retry_after_s


class RequestTooLarge(ServiceError):
    """413: the request body is over the service's cap."""


class ServiceUnavailable(ServiceError):
    """503 (the service is full) or the service cannot be reached: retry later.

    `retry_after_s` is the service's `Retry-After` when it sent one. `may_have_run` is set when the
    connection failed after the request was sent: the service may have applied it, so the client
    retries it only if repeating it is harmless (GET, DELETE)."""

    def __init__(
        self, status: int, code: str, message: str, retry_after_s: float | None = None, may_have_run: bool = False
    ):
        super().__init__(status, code, message)
        self.retry_after_s, self.may_have_run = retry_after_s, may_have_run


def retry_after_s(resp: httpx.Response) -> float | None:
    """The `Retry-After` header in seconds (delta-seconds or an HTTP date), None when absent or unreadable."""
    value = resp.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def raise_for(resp: httpx.Response) -> None:
    """Raise the typed error of an error answer; nothing for a success."""
    if resp.status_code < 400:
        return
    try:
        body = resp.json()
    except ValueError:
        body = {}
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        code, message = str(err.get("code", "")), str(err.get("message", ""))
    else:
        code, message = "invalid_request", json.dumps(body.get("detail", body) if isinstance(body, dict) else body)
    status = resp.status_code
    if status == 401:
        raise AuthenticationError(status, code, message)
    if status == 404:
        raise NotFoundError(status, code, message)
    if status == 410 or code == "infra_error":
        raise SessionLost(status, code, message)
    if status == 429:
        wait = retry_after_s(resp)
        raise QuotaExceededError(status, code, message, 1.0 if wait is None else wait)
    if status == 413:
        raise RequestTooLarge(status, code, message)
    if status == 503:
        raise ServiceUnavailable(status, code, message, retry_after_s(resp))
    raise ServiceError(status, code, message)


def unreachable(base_url: str, exc: httpx.TransportError, may_have_run: bool) -> ServiceUnavailable:
    return ServiceUnavailable(
        0, "unreachable", f"cannot reach the envforge service at {base_url}: {exc}", may_have_run=may_have_run
    )
