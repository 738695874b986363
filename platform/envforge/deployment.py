"""Which services envforge talks to, chosen by `ENVFORGE_ENV` (`local`, the default, or `production`).

envforge.settings declares and reads the values (data dir, MLflow URI, Docker host, ...); this module says
which of them an environment requires and what they must look like, and which policy the rollout
and tier steps use by default:

- local: the DuckDB catalog and a SQLite MLflow store under ENVFORGE_DATA_DIR (or any
  MLFLOW_TRACKING_URI), the local Docker socket (or DOCKER_HOST), and the `replay` policy (reference
  solutions, CPU only) with tiers from static features.
- production: the same catalog on a volume; MLFLOW_TRACKING_URI required, http(s); DOCKER_HOST
  required, tcp:// or ssh:// (the engine images are built on; sandboxes run there too unless
  ENVFORGE_RAY_ADDRESS names a Ray cluster of sandbox nodes, see docs/fleet.md); ENVFORGE_POLICY_URL required, an OpenAI-compatible vLLM
  server whose policy, named `vllm` (= `openai:<url>#<ENVFORGE_POLICY_MODEL>`), is the rollout
  default and the tiering reference.

A production variable that is missing or malformed raises `DeploymentError` naming every such
variable and what it should be, so a misconfigured deployment fails when it loads, not in the
middle of a run. Nothing here imports Dagster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import urlsplit

from envforge.config import Settings

ENVIRONMENTS = ("local", "production")
REPLAY = "replay"
# The rollout-partition name of the served policy: a short, Dagster-safe key (URLs are not keys).
SERVED_POLICY = "vllm"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class DeploymentError(ValueError):
    """The environment variables do not describe a usable deployment; the message names each variable."""


@dataclass(frozen=True)
class NamedPolicy:
    """A policy spec (`envforge.rollout.policies.factory.make_policy`) under a short name usable as a
    partition key."""

    name: str
    spec: str

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"policy name {self.name!r}: use letters, digits, '_', '-', '.' (it is a partition key)")


@dataclass(frozen=True)
class Deployment:
    """One environment's choices: the Settings, the named policies (the first is the rollout default),
    and the policy tiering uses by default (None: static features)."""

    env: str
    settings: Settings
    policies: tuple[NamedPolicy, ...]
    tier_policy: str | None = None

    @property
    def default_policy(self) -> NamedPolicy:
        return self.policies[0]

    @property
    def policy_specs(self) -> dict[str, str]:
        return {p.name: p.spec for p in self.policies}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Deployment":
        from envforge.settings import SettingsError, read_env

        try:
            env = read_env(environ)
        except SettingsError as exc:
            raise DeploymentError(str(exc)) from None
        name = env.env.lower()
        if name not in ENVIRONMENTS:
            raise DeploymentError(
                f"ENVFORGE_ENV={env.env!r}: expected one of {', '.join(ENVIRONMENTS)} (unset means local)"
            )
        problems: list[str] = []
        served = _served_policy(env, required=name == "production", problems=problems)
        if name == "production":
            _check_url(
                "MLFLOW_TRACKING_URI",
                env.mlflow_tracking_uri,
                ("http", "https"),
                "the http(s) URL of the MLflow tracking server, e.g. http://mlflow:5000",
                problems,
            )
            _check_docker_host(env.docker_host, problems)
        _check_fleet(env.ray_address, problems)
        if problems:
            raise DeploymentError(f"ENVFORGE_ENV={name} is misconfigured:\n  " + "\n  ".join(problems))
        settings = Settings.from_env(environ)
        if name == "production":
            assert served is not None
            return cls(name, settings, (served, NamedPolicy(REPLAY, REPLAY)), tier_policy=served.spec)
        return cls(name, settings, (NamedPolicy(REPLAY, REPLAY),) + ((served,) if served else ()))


def _served_policy(env: Any, required: bool, problems: list[str]) -> NamedPolicy | None:
    """`vllm` -> openai:<ENVFORGE_POLICY_URL>[#ENVFORGE_POLICY_MODEL]; optional locally, required in production.
    `env`: envforge.settings.EnvSettings."""
    if not env.policy_url and not required:
        return None
    url = _check_url(
        "ENVFORGE_POLICY_URL",
        env.policy_url,
        ("http", "https"),
        "the base URL of an OpenAI-compatible server such as `vllm serve`, ending in /v1, e.g. http://vllm:8000/v1",
        problems,
    )
    if url is None:
        return None
    return NamedPolicy(SERVED_POLICY, f"openai:{url.rstrip('/')}#{env.policy_model}")


def _check_url(var: str, value: str | None, schemes: tuple[str, ...], expected: str, problems: list[str]) -> str | None:
    if not value:
        problems.append(f"{var} is not set: expected {expected}")
        return None
    parts = urlsplit(value)
    if parts.scheme not in schemes or not parts.hostname:
        problems.append(f"{var}={value!r} is not valid: expected {expected}")
        return None
    return value


def _check_docker_host(value: str | None, problems: list[str]) -> None:
    expected = "tcp://HOST:PORT or ssh://USER@HOST of the remote Docker engine sandboxes run on"
    if value and "," in value:
        problems.append(
            f"DOCKER_HOST={value!r}: one engine per process (it builds the images); to run sandboxes "
            f"on many engines, set ENVFORGE_RAY_ADDRESS to a Ray cluster whose nodes each own one "
            f"(docs/fleet.md)"
        )
        return
    _check_url("DOCKER_HOST", value, ("tcp", "ssh"), expected, problems)


def _check_fleet(value: str, problems: list[str]) -> None:
    """ENVFORGE_RAY_ADDRESS, when set, sends sandbox work to a Ray cluster: HOST:PORT or ray://HOST:PORT."""
    if not value or value == "auto":
        return
    hostport = value[len("ray://") :] if value.startswith("ray://") else value
    host, _, port = hostport.rpartition(":")
    if "://" in hostport or not host or not port.isdigit():
        problems.append(
            f"ENVFORGE_RAY_ADDRESS={value!r} is not valid: expected the Ray head as HOST:PORT (GCS, "
            f"e.g. ray-head:6379) or ray://HOST:PORT (Ray Client, e.g. ray://ray-head:10001)"
        )
