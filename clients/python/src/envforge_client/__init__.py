"""envforge-client: the environment service's Python client, without the platform (httpx, pydantic and
tenacity only). `Client` / `AsyncClient`, the typed errors, `RetryPolicy`; the API models in `.models`."""

from envforge_client.client import AsyncClient, AsyncSession, Client, Session
from envforge_client.errors import (
    AuthenticationError,
    NotFoundError,
    QuotaExceededError,
    RequestTooLarge,
    ServiceError,
    ServiceUnavailable,
    SessionLost,
)
from envforge_client.retries import RetryPolicy

__all__ = [
    "AsyncClient",
    "AsyncSession",
    "AuthenticationError",
    "Client",
    "NotFoundError",
    "QuotaExceededError",
    "RequestTooLarge",
    "RetryPolicy",
    "ServiceError",
    "ServiceUnavailable",
    "Session",
    "SessionLost",
]
