"""Every environment variable envforge reads, declared once: typed, with its default and help text.

`read_env()` is the one reader: the typed configs (`config.Settings`, `fleet.config.FleetConfig`,
`service.config.ServiceConfig`, `deployment.Deployment`, the observability switches, object
storage, the source policy, decontamination's corpora...) take their values from the
`EnvSettings` it returns instead of parsing `os.environ` themselves. The fleet's and the service's
variables are declared here too; their typed configs (which Python and YAML callers construct
directly) take each field's default and help from these declarations.

docs/configuration.md is generated from this model (`envforge config docs`) and
`envforge config show` prints the effective values and where each came from. Importing this
module costs pydantic-settings (~0.2 s): import it inside functions from modules the CLI loads
at start-up.

Not declared here, because envforge does not read them as settings: variables it sets for a
sandbox's processes (ENVFORGE_CMD, ENVFORGE_TEST_FILES, ...; `NOT_SETTINGS`), the proxy variables
it forwards into image builds, and variables other libraries read themselves
(OTEL_EXPORTER_OTLP_*, DAGSTER_HOME, RAY_*).
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal, Mapping, Optional

from pydantic import Field, SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from envforge.checkout import checkout_root
from envforge.errors import EnvforgeError

# The groups of docs/configuration.md and `envforge config show`, in their order.
GROUPS = {
    "core": "Core paths and stores",
    "storage": "Object storage (S3-compatible)",
    "deployment": "Deployment and policy server",
    "sandbox": "Sandboxes and the Docker engine",
    "fleet": "Fleet (Ray cluster of sandbox nodes)",
    "sources": "Task sources",
    "verification": "Verification and data-quality checks",
    "quality": "Decontamination (quality)",
    "service": "Environment service",
    "observability": "Observability",
    "health": "Run health thresholds",
}

# ENVFORGE_* names in the source that are not settings: what envforge sets for a process it starts
# (inside a sandbox or a build), and heredoc markers. The drift test greps the source against these
# and the model, so a new variable cannot be read without being declared.
NOT_SETTINGS = {
    "ENVFORGE_BASE": "build argument of a task's environment.dockerfile (FROM ${ENVFORGE_BASE})",
    "ENVFORGE_CMD": "set by the sandbox agent for the command script it runs",
    "ENVFORGE_TEST_FILES": "set by the verifier for the test reporter inside the sandbox",
    "ENVFORGE_TEST_ORDER": "set by the verifier for the test runners inside the sandbox",
    "ENVFORGE_FAIL_FAST": "set by the verifier for the test reporter inside the sandbox",
    "ENVFORGE_TEST_IDS": "set by the verifier for the test reporter inside the sandbox (a mutant's covering tests)",
    "ENVFORGE_TRACE_CALLS": "set by the verifier for the test reporter inside the sandbox (the traced grading)",
    "ENVFORGE_PYTHONPATH": "set by the verifier for checkpoint scripts inside the sandbox",
    "ENVFORGE_PROJECT_MODULES": "set by the verifier for the pytest launcher inside the sandbox (tests.modules)",
    "ENVFORGE_VERIFIER": "set by the verifier for checkpoint scripts inside the sandbox",
    "ENVFORGE_EOF": "a heredoc marker in shell programs",
    "ENVFORGE_RUNBOOK_EOF": "a heredoc marker in shell programs",
}

# Variables of the deployment scripts and compose files (platform/deploy): read by them, not by envforge.
DEPLOY_VARIABLES = {
    "ENVFORGE_DOCKER_HOST": "production compose: the services' DOCKER_HOST (docs/deploy.md)",
    "ENVFORGE_SSH_DIR": "production compose: the ssh folder mounted for an ssh:// engine (docs/deploy.md)",
    "ENVFORGE_MODELS_DIR": "production compose: the host folder of model weights, mounted at /models",
    "ENVFORGE_NODE_SANDBOXES": "fleet-node.sh: sandboxes the node may lease at once (docs/fleet.md)",
    "ENVFORGE_NODE_DOCKERD": "fleet-node.sh: 1 starts dockerd in the node's container (docs/fleet.md)",
    "ENVFORGE_DOCKER_SOCKET": "docker-engine.sh: the engine socket it waits for",
    "ENVFORGE_DOCKER_WAIT_S": "docker-engine.sh, fleet-engine.sh: how long to wait for the engine",
    "ENVFORGE_DOCKERD_LOG": "docker-engine.sh: dockerd's log file",
    "ENVFORGE_FLEET_RUN_DIR": "fleet-engine.sh: run folder of a node's engine",
    "ENVFORGE_FLEET_DATA_DIR": "fleet-engine.sh: data folder of a node's engine",
}

_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("envforge_settings_environ", default=None)


class SettingsError(EnvforgeError, ValueError):
    """Environment variables hold values envforge cannot use; the message names each variable.
    `problems`: (variable, its value, what it expects, the setting's help) of each."""

    def __init__(self, problems: list[tuple[str, str | None, str, str]]) -> None:
        self.problems = problems
        super().__init__(
            "\n".join(
                f"environment variable {var}: {expected}, got {raw!r}" + (f" ({help})" if help else "")
                for var, raw, expected, help in problems
            )
        )


_EXPECTED = {
    "int_parsing": "expected a whole number",
    "int_from_float": "expected a whole number",
    "float_parsing": "expected a number",
    "bool_parsing": "expected true or false (1/0, yes/no, on/off)",
}


def _expected(err: Any) -> str:
    if err["type"] == "literal_error":
        return "expected one of " + str(err.get("ctx", {}).get("expected", "")).replace("'", "")
    return _EXPECTED.get(err["type"], err["msg"])


def _var(
    env: str,
    default: Any,
    group: str,
    help: str,
    *,
    secret: bool = False,
    default_doc: str | None = None,
    keep_empty: bool = False,
    default_from: str | None = None,
    default_factory: Any = None,
) -> Any:
    """A setting: its variable `env`, its default (`default_doc` says it in words where it depends on the
    machine, `default_from` where a typed config holds it), its group and help. `keep_empty`: an empty
    value means something (it is not the same as unset)."""
    extra: dict[str, Any] = {
        "group": group,
        "secret": secret,
        "default_doc": default_doc,
        "keep_empty": keep_empty,
        "default_from": default_from,
    }
    if default_factory is not None:
        return Field(default_factory=default_factory, validation_alias=env, description=help, json_schema_extra=extra)
    return Field(default, validation_alias=env, description=help, json_schema_extra=extra)


_HEALTH = "envforge.observe.health:HealthThresholds"


class EnvSettings(BaseSettings):
    """Every setting envforge reads from the environment (`read_env()` builds it)."""

    model_config = SettingsConfigDict(case_sensitive=True, extra="ignore", frozen=True)

    # -- core paths and stores
    data_dir: Path = _var(
        "ENVFORGE_DATA_DIR",
        None,
        "core",
        "catalog, MLflow store, build scratch, checkpoints",
        default_doc="`<checkout>/.envforge`",
        default_factory=lambda: checkout_root() / ".envforge",
    )
    sandboxes_dir: Path = _var(
        "ENVFORGE_SANDBOXES_DIR",
        None,
        "core",
        "base image recipe and task families",
        default_doc="`<checkout>/sandboxes`",
        default_factory=lambda: checkout_root() / "sandboxes",
    )
    task_sources_dir: Path = _var(
        "ENVFORGE_TASK_SOURCES",
        None,
        "core",
        "bundled and user task sources",
        default_doc="`<checkout>/task_sources`",
        default_factory=lambda: checkout_root() / "task_sources",
    )
    store_url: Optional[str] = _var(
        "ENVFORGE_STORE_URL",
        None,
        "core",
        "s3://bucket/prefix for rollouts, task-set parquet and reports (unset: under the data dir)",
    )
    mlflow_tracking_uri: Optional[str] = _var(
        "MLFLOW_TRACKING_URI",
        None,
        "core",
        "the MLflow tracking store; production requires an http(s) server",
        default_doc="`sqlite:///<data dir>/mlflow.db`",
    )
    mlflow_experiment: str = _var("ENVFORGE_MLFLOW_EXPERIMENT", "envforge", "core", "MLflow experiment of runs")
    mlflow_ui_url: str = _var(
        "ENVFORGE_MLFLOW_UI_URL",
        "http://127.0.0.1:5000",
        "core",
        "where run links point when the tracking URI is not an http(s) server "
        "(`make mlflow-ui` serves the local store there)",
    )

    # -- object storage
    s3_endpoint_url: Optional[str] = _var(
        "ENVFORGE_S3_ENDPOINT_URL",
        None,
        "storage",
        "S3-compatible endpoint (MinIO, Ceph...); unset: AWS_ENDPOINT_URL, else AWS",
    )
    aws_endpoint_url: Optional[str] = _var(
        "AWS_ENDPOINT_URL",
        None,
        "storage",
        "the AWS SDKs' endpoint variable, used when ENVFORGE_S3_ENDPOINT_URL is unset",
    )
    aws_access_key_id: Optional[SecretStr] = _var("AWS_ACCESS_KEY_ID", None, "storage", "access key", secret=True)
    aws_secret_access_key: Optional[SecretStr] = _var(
        "AWS_SECRET_ACCESS_KEY", None, "storage", "secret key", secret=True
    )
    aws_session_token: Optional[SecretStr] = _var(
        "AWS_SESSION_TOKEN", None, "storage", "session token of temporary credentials", secret=True
    )
    aws_default_region: Optional[str] = _var("AWS_DEFAULT_REGION", None, "storage", "bucket region")
    aws_region: Optional[str] = _var("AWS_REGION", None, "storage", "bucket region, when AWS_DEFAULT_REGION is unset")
    aws_profile: Optional[str] = _var("AWS_PROFILE", None, "storage", "credentials from ~/.aws instead of variables")
    aws_web_identity_token_file: Optional[str] = _var(
        "AWS_WEB_IDENTITY_TOKEN_FILE", None, "storage", "a pod role's token (EKS IRSA): counts as credentials"
    )
    aws_container_credentials_relative_uri: Optional[str] = _var(
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", None, "storage", "an ECS task role: counts as credentials"
    )
    aws_container_credentials_full_uri: Optional[str] = _var(
        "AWS_CONTAINER_CREDENTIALS_FULL_URI", None, "storage", "a container role: counts as credentials"
    )

    # -- deployment and policy server
    env: str = _var(
        "ENVFORGE_ENV",
        "local",
        "deployment",
        "`local` or `production`: which services are required and how they must look (docs/deploy.md)",
    )
    policy_url: Optional[str] = _var(
        "ENVFORGE_POLICY_URL",
        None,
        "deployment",
        "base URL of an OpenAI-compatible policy server (vLLM), ending in /v1; "
        "required in production, where it is the rollout default (`vllm`)",
    )
    policy_model: str = _var(
        "ENVFORGE_POLICY_MODEL",
        "envforge",
        "deployment",
        "the served model name at ENVFORGE_POLICY_URL (`vllm serve --served-model-name`)",
    )

    # -- sandboxes and the engine
    docker_host: Optional[str] = _var(
        "DOCKER_HOST",
        None,
        "sandbox",
        "the Docker engine images are built on "
        "(and sandboxes run on without a fleet); production requires tcp:// or "
        "ssh://",
        default_doc="the local socket",
    )
    sandbox_threads: int = _var(
        "ENVFORGE_SANDBOX_THREADS", 256, "sandbox", "threads that run blocking sandbox calls for async callers"
    )
    sandbox_ceiling: int = _var(
        "ENVFORGE_SANDBOX_CEILING",
        0,
        "sandbox",
        "sandboxes a derivation or a gate on this engine may run at once while the host's CPUs have room "
        "(beyond its concurrency, one more per second while they were under 80% used; sandbox/admission.py); "
        "0: four per core; no more than the concurrency: a fixed count",
        default_doc="0 (four per core)",
    )

    # -- task sources
    source_config: Optional[Path] = _var(
        "ENVFORGE_SOURCE_CONFIG", None, "sources", "a YAML file of source-policy fields (docs/security.md)"
    )
    source_roots: Optional[str] = _var(
        "ENVFORGE_SOURCE_ROOTS",
        None,
        "sources",
        "folders a source's paths may resolve into, `:`-separated (overrides the "
        "file; empty: every source confined to its own folder)",
        default_doc="the task-sources dir",
        keep_empty=True,
    )
    moving_refs: Optional[Literal["resolve", "refuse"]] = _var(
        "ENVFORGE_MOVING_REFS",
        None,
        "sources",
        "`resolve` or `refuse` a branch given as a commit (overrides the file)",
        default_doc="the file's, else resolve",
    )
    derive_memory_ceiling_mb: int = _var(
        "ENVFORGE_DERIVE_MEMORY_CEILING_MB",
        4096,
        "sources",
        "MB of sandbox memory a history candidate is derived with once more when its tests were killed for "
        "memory (the task keeps it); no more than the source's limits.memory_mb: no retry",
    )

    # -- verification and data-quality checks
    gate_runs: int = _var(
        "ENVFORGE_GATE_RUNS",
        5,
        "verification",
        "gradings of the empty and of the reference solution per task in the flakiness gate",
    )
    max_reject_rate: float = _var(
        "ENVFORGE_MAX_REJECT_RATE",
        0.5,
        "verification",
        "Dagster check: share of a source's records rejected above which it warns",
    )
    max_quarantine_rate: float = _var(
        "ENVFORGE_MAX_QUARANTINE_RATE",
        0.2,
        "verification",
        "Dagster check: share of a gate run's tasks quarantined above which it fails",
    )
    max_dropped_group_rate: float = _var(
        "ENVFORGE_MAX_DROPPED_GROUP_RATE",
        0.05,
        "verification",
        "Dagster check: share of a rollout batch's groups dropped above which it fails",
    )

    # -- decontamination
    corpora: str = _var(
        "ENVFORGE_CORPORA",
        "",
        "quality",
        "reference corpora every run checks against besides "
        "HumanEval and the registered ones: `NAME=PATH` items separated by `;`",
    )
    embeddings_api_key: Optional[SecretStr] = _var(
        "ENVFORGE_EMBEDDINGS_API_KEY",
        None,
        "quality",
        "API key of the embeddings server of the semantic stage (the variable `semantic.api_key_env` names by default)",
        secret=True,
    )
    policy_api_key: Optional[SecretStr] = _var(
        "ENVFORGE_POLICY_API_KEY",
        None,
        "deployment",
        "API key `envforge policy serve` requires on its /v1 routes (`--api-key` overrides; unset: no key)",
        secret=True,
    )
    review_api_key: Optional[SecretStr] = _var(
        "ENVFORGE_REVIEW_API_KEY",
        None,
        "quality",
        "API key of the endpoint of the optional model review of task "
        "statements (the variable `review.api_key_env` names by default)",
        secret=True,
    )

    # -- service clients
    service_url: str = _var(
        "ENVFORGE_SERVICE_URL",
        "http://127.0.0.1:8080",
        "service",
        "the envforge service clients talk to (`rollout --service`, the verl reward function)",
    )
    api_key: Optional[SecretStr] = _var(
        "ENVFORGE_API_KEY", None, "service", "the service key the verl reward function sends", secret=True
    )

    # -- observability
    metrics: bool = _var(
        "ENVFORGE_METRICS",
        True,
        "observability",
        "record Prometheus metrics (0/false/off/no: every hook returns at once)",
    )
    metrics_port: Optional[str] = _var(
        "ENVFORGE_METRICS_PORT",
        None,
        "observability",
        "serve /metrics on this port during a run (0: a free one; off: never)",
        default_doc="off for CLI runs, a free port in Dagster runs and services",
    )
    metrics_host: str = _var("ENVFORGE_METRICS_HOST", "127.0.0.1", "observability", "address /metrics listens on")
    metrics_linger_s: float = _var(
        "ENVFORGE_METRICS_LINGER_S",
        0.0,
        "observability",
        "keep serving /metrics this long after a run, for a last scrape",
    )
    metrics_targets_dir: Optional[Path] = _var(
        "ENVFORGE_METRICS_TARGETS_DIR",
        None,
        "observability",
        "Prometheus file_sd directory processes register in",
        default_doc="`<data dir>/observe/targets`",
    )
    traces: str = _var(
        "ENVFORGE_TRACES",
        "off",
        "observability",
        "`off`, `console` or `otlp` (to OTEL_EXPORTER_OTLP_ENDPOINT, which the exporter reads itself)",
    )
    log_format: str = _var(
        "ENVFORGE_LOG_FORMAT",
        "text",
        "observability",
        "`json`: JSON log lines on stderr; `text`: the host application's logging",
    )
    log_level: str = _var("ENVFORGE_LOG_LEVEL", "INFO", "observability", "level of the JSON logs")

    # -- run health (defaults: HealthThresholds)
    health_max_fault_rate_increase: Optional[float] = _var(
        "ENVFORGE_HEALTH_MAX_FAULT_RATE_INCREASE",
        None,
        "health",
        "infrastructure faults per attempt may grow by at most this much over the previous batch",
        default_from=_HEALTH,
    )
    health_max_fault_rate: Optional[float] = _var(
        "ENVFORGE_HEALTH_MAX_FAULT_RATE",
        None,
        "health",
        "infrastructure faults per attempt above this are an anomaly",
        default_from=_HEALTH,
    )
    health_max_retry_rate_increase: Optional[float] = _var(
        "ENVFORGE_HEALTH_MAX_RETRY_RATE_INCREASE",
        None,
        "health",
        "the share of trajectories that needed a retry may grow by at most this much",
        default_from=_HEALTH,
    )
    health_max_drop_rate_increase: Optional[float] = _var(
        "ENVFORGE_HEALTH_MAX_DROP_RATE_INCREASE",
        None,
        "health",
        "the share of groups dropped may grow by at most this much",
        default_from=_HEALTH,
    )
    health_max_latency_ratio: Optional[float] = _var(
        "ENVFORGE_HEALTH_MAX_LATENCY_RATIO",
        None,
        "health",
        "median reset or step time may grow by at most this factor",
        default_from=_HEALTH,
    )
    health_min_latency_increase_s: Optional[float] = _var(
        "ENVFORGE_HEALTH_MIN_LATENCY_INCREASE_S",
        None,
        "health",
        "a latency rule fires only when the median also grew by this many seconds",
        default_from=_HEALTH,
    )
    health_max_reward_drop: Optional[float] = _var(
        "ENVFORGE_HEALTH_MAX_REWARD_DROP",
        None,
        "health",
        "mean reward on shared cleanly-run tasks may fall by at most this",
        default_from=_HEALTH,
    )
    health_max_pass_at_1_drop: Optional[float] = _var(
        "ENVFORGE_HEALTH_MAX_PASS_AT_1_DROP",
        None,
        "health",
        "pass@1 on shared cleanly-run tasks may fall by at most this",
        default_from=_HEALTH,
    )
    health_min_clean_tasks: Optional[int] = _var(
        "ENVFORGE_HEALTH_MIN_CLEAN_TASKS",
        None,
        "health",
        "the policy side is judged only on at least this many shared cleanly-run tasks",
        default_from=_HEALTH,
    )

    # -- fleet (envforge.fleet.config.FleetConfig takes its defaults and help from these and checks the ranges)
    ray_address: str = _var(
        "ENVFORGE_RAY_ADDRESS",
        "",
        "fleet",
        "the Ray head, `HOST:PORT` (GCS, usually 6379) for a driver on a cluster node or "
        "`ray://HOST:10001` for Ray Client; empty = `auto` (a cluster started on this machine)",
    )
    fleet_namespace: str = _var(
        "ENVFORGE_FLEET_NAMESPACE",
        "envforge",
        "fleet",
        "Ray namespace of the node agents; drivers that share it share the agents and their warm pools",
    )
    fleet_node_resource: str = _var(
        "ENVFORGE_FLEET_NODE_RESOURCE",
        "envforge_sandboxes",
        "fleet",
        "the Ray custom resource a sandbox node advertises; its amount is how many "
        "sandboxes the node may lease at once",
    )
    fleet_max_idle_per_image: int = _var(
        "ENVFORGE_FLEET_MAX_IDLE_PER_IMAGE", 4, "fleet", "warm sandboxes a node keeps per image at most"
    )
    fleet_max_idle_per_node: int = _var(
        "ENVFORGE_FLEET_MAX_IDLE_PER_NODE", 16, "fleet", "warm sandboxes a node keeps in all at most"
    )
    fleet_idle_shrink_after_s: float = _var(
        "ENVFORGE_FLEET_IDLE_SHRINK_AFTER_S",
        30.0,
        "fleet",
        "an image nobody has asked for this long loses its warm sandboxes",
    )
    fleet_lease_idle_timeout_s: float = _var(
        "ENVFORGE_FLEET_LEASE_IDLE_TIMEOUT_S",
        900.0,
        "fleet",
        "a lease untouched this long is reclaimed by the node, even if its driver still beats",
    )
    fleet_driver_timeout_s: float = _var(
        "ENVFORGE_FLEET_DRIVER_TIMEOUT_S",
        60.0,
        "fleet",
        "a driver whose heartbeat (every 5 s while it holds leases) a node has "
        "not heard this long has died: its leases there are reclaimed",
    )
    fleet_acquire_timeout_s: float = _var(
        "ENVFORGE_FLEET_ACQUIRE_TIMEOUT_S",
        900.0,
        "fleet",
        "backpressure: how long an acquire waits for free capacity before it fails as an infrastructure fault",
    )
    fleet_image_distribution: Literal["auto", "transfer", "build"] = _var(
        "ENVFORGE_FLEET_IMAGE_DISTRIBUTION",
        "auto",
        "fleet",
        "how a node gets an image it lacks: `transfer` (docker save/load through Ray's object store), `build` "
        "(from the same recipe, content-hash tag), or `auto` (build task layers, transfer base images: what "
        "bench/fleet.py measured to be faster)",
    )
    fleet_discovery_interval_s: float = _var(
        "ENVFORGE_FLEET_DISCOVERY_INTERVAL_S",
        2.0,
        "fleet",
        "how often the dispatcher looks for nodes that joined or left",
    )
    fleet_min_engine_version: str = _var(
        "ENVFORGE_FLEET_MIN_ENGINE_VERSION", "20.10", "fleet", "the oldest Docker engine a node may run"
    )
    fleet_connect_timeout_s: float = _var(
        "ENVFORGE_FLEET_CONNECT_TIMEOUT_S", 10.0, "fleet", "how long to wait for the Ray head to answer at start"
    )

    # -- the service (envforge.service.config.ServiceConfig takes its defaults and help from these)
    service_host: str = _var(
        "ENVFORGE_SERVICE_HOST", "127.0.0.1", "service", "address to listen on (TLS is terminated in front)"
    )
    service_port: int = _var("ENVFORGE_SERVICE_PORT", 8080, "service", "port to listen on")
    service_idle_timeout_s: float = _var(
        "ENVFORGE_SERVICE_IDLE_TIMEOUT_S",
        600.0,
        "service",
        "a session with no request for this long is reaped: its sandbox reset and returned",
    )
    service_reap_interval_s: float = _var(
        "ENVFORGE_SERVICE_REAP_INTERVAL_S", 5.0, "service", "how often idle sessions are looked for"
    )
    service_max_request_bytes: int = _var(
        "ENVFORGE_SERVICE_MAX_REQUEST_BYTES",
        512 * 1024,
        "service",
        "largest request body accepted (413 above it); actions are capped at 256 KiB too",
    )
    service_max_sessions_total: int = _var(
        "ENVFORGE_SERVICE_MAX_SESSIONS", 256, "service", "sessions open at once, all tenants together"
    )
    service_pool_idle_per_image: int = _var(
        "ENVFORGE_SERVICE_POOL_IDLE", 8, "service", "warm sandboxes kept per task image"
    )
    service_pool_max_starting: int = _var(
        "ENVFORGE_SERVICE_POOL_MAX_STARTING", 4, "service", "container starts in flight at once"
    )
    service_record_every_sessions: int = _var(
        "ENVFORGE_SERVICE_RECORD_EVERY",
        100,
        "service",
        "finished sessions per MLflow run (a batch); also flushed on a timer and at exit",
    )
    service_record_every_s: float = _var(
        "ENVFORGE_SERVICE_RECORD_EVERY_S",
        300.0,
        "service",
        "longest time a finished session waits before its batch is written to the catalog and MLflow",
    )
    service_mlflow: bool = _var(
        "ENVFORGE_SERVICE_MLFLOW",
        True,
        "service",
        "log each batch of finished sessions as an MLflow run (the catalog records every session either way)",
    )
    service_tombstone_s: float = _var(
        "ENVFORGE_SERVICE_TOMBSTONE_S",
        3600.0,
        "service",
        "how long a reaped or lost session's id still answers 410 (then 404)",
    )
    service_replica: str = _var(
        "ENVFORGE_SERVICE_REPLICA",
        "",
        "service",
        "this process's name in a set of replicas behind a proxy (r0, r1, ...; `serve --replicas` sets it): "
        "it prefixes session ids so the proxy routes each session to its replica; empty for one process",
    )
    service_lease_ttl_s: float = _var(
        "ENVFORGE_SERVICE_LEASE_TTL_S",
        30.0,
        "service",
        "a replica silent this long counts as dead: its sessions stop counting against tenants' quotas "
        "(a dead replica on the same host is found at once, by its pid)",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, _EnvironSource(settings_cls))

    @property
    def corpus_specs(self) -> list[str]:
        """ENVFORGE_CORPORA's NAME=PATH items."""
        return [s for s in self.corpora.split(";") if s.strip()]


class _EnvironSource(EnvSettingsSource):
    """The environment `read_env` was given. An empty value is unset (the default applies) except for the
    settings whose empty value means something (`keep_empty`); values are stripped."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        environ = _ENVIRON.get()
        env = os.environ if environ is None else environ
        out: dict[str, str | None] = {}
        for f in EnvSettings.model_fields.values():
            var = str(f.validation_alias)
            raw = env.get(var)
            if raw is None or (not raw.strip() and not _extra(f)["keep_empty"]):
                continue
            out[var] = raw.strip()
        return out


def _extra(f: FieldInfo) -> dict[str, Any]:
    return f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}


def read_env(environ: Mapping[str, str] | None = None) -> Any:
    """The settings in `environ` (default: the process environment), each unset one at its default.
    A value of the wrong type raises SettingsError naming each such variable and what it expects."""
    token = _ENVIRON.set(environ)
    try:
        return EnvSettings()
    except ValidationError as exc:
        env = os.environ if environ is None else environ
        problems = []
        for err in exc.errors():
            var = str(err["loc"][0]) if err["loc"] else ""
            f = field_of(var)
            problems.append((var, env.get(var), _expected(err), (f.description or "") if f is not None else ""))
        raise SettingsError(problems) from None
    finally:
        _ENVIRON.reset(token)


def variables() -> dict[str, str]:
    """Each declared variable and its setting's name, in declaration order."""
    return {str(f.validation_alias): name for name, f in EnvSettings.model_fields.items()}


def field_of(var: str) -> FieldInfo | None:
    """The declaration of the setting variable `var` sets (None: not a setting)."""
    name = variables().get(var)
    return EnvSettings.model_fields[name] if name else None


def default_text(name: str) -> str:
    """A setting's default as docs show it: its words for machine-dependent defaults, the typed config's
    value where that holds it, else the value ("" when unset means off)."""
    f = EnvSettings.model_fields[name]
    extra = _extra(f)
    if extra["default_doc"]:
        return str(extra["default_doc"])
    if extra["default_from"]:
        import importlib
        from dataclasses import fields as dc_fields

        module, _, cls_name = str(extra["default_from"]).partition(":")
        cls = getattr(importlib.import_module(module), cls_name)
        field_name = name.removeprefix("health_")
        return str(next(d.default for d in dc_fields(cls) if d.name == field_name))
    if f.default is None:
        return "unset"
    return str(f.default)


def origins(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Where each setting's effective value comes from: `environment` (its variable) or `default`
    (there is no .env file or other source)."""
    env = os.environ if environ is None else environ
    out = {}
    for name, f in EnvSettings.model_fields.items():
        var = str(f.validation_alias)
        raw = env.get(var)
        set_here = raw is not None and (bool(raw.strip()) or _extra(f)["keep_empty"])
        out[name] = "environment" if set_here else "default"
    return out


def is_secret(name: str) -> bool:
    return bool(_extra(EnvSettings.model_fields[name])["secret"])


def group_of(name: str) -> str:
    return str(_extra(EnvSettings.model_fields[name])["group"])
