"""The service's Python client lives in the `envforge-client` package (clients/python, import
`envforge_client`), which a trainer installs without the platform. These names keep envforge's own
imports (the adapters, examples, tests) working."""

from envforge_client.client import AsyncClient as AsyncEnvforgeClient
from envforge_client.client import AsyncSession as AsyncEnvSession
from envforge_client.client import Client as EnvforgeClient
from envforge_client.client import Session as EnvSession
from envforge_client.client import session_body, step_body
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
    "AsyncEnvSession",
    "AsyncEnvforgeClient",
    "AuthenticationError",
    "EnvSession",
    "EnvforgeClient",
    "NotFoundError",
    "QuotaExceededError",
    "RequestTooLarge",
    "RetryPolicy",
    "ServiceError",
    "ServiceUnavailable",
    "SessionLost",
    "session_body",
    "step_body",
]
