"""Environments and deploy files: resources chosen by ENVFORGE_ENV, the sandbox concurrency pool,
the local and production instance configs, and the production compose example's wiring."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from assets.defs.resources import SANDBOX_POOL, PolicyResource, default_resources
from envforge.deployment import Deployment, DeploymentError
from tests.conftest import REPO

DEPLOY = REPO / "platform" / "deploy"
PROD = DEPLOY / "production"
PROD_ENV = {
    "ENVFORGE_ENV": "production",
    "MLFLOW_TRACKING_URI": "http://mlflow:5000",
    "DOCKER_HOST": "ssh://envforge@sandbox-host",
    "ENVFORGE_POLICY_URL": "http://vllm:8000/v1",
}
REQUIRED_IN_PRODUCTION = ("MLFLOW_TRACKING_URI", "DOCKER_HOST", "ENVFORGE_POLICY_URL")


# --- environment selection ------------------------------------------------------------------

def test_local_is_the_default(tmp_path):
    dep = Deployment.from_env({"ENVFORGE_DATA_DIR": str(tmp_path)})
    assert dep.env == "local"
    assert dep.settings.mlflow_tracking_uri == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    assert dep.settings.docker_host is None
    assert dep.default_policy.spec == "replay" and dep.tier_policy is None

    res = default_resources(deployment=dep)
    assert Path(res["catalog"].data_dir) == tmp_path.resolve()
    assert res["docker"].docker_host is None
    assert res["mlflow"].tracking_uri.startswith("sqlite:///")
    policy = res["policy"]
    assert isinstance(policy, PolicyResource)
    assert policy.partition_keys() == ["replay"] and policy.tier_policy == ""
    assert policy.spec_for("replay") == "replay" and policy.spec_for("replay-text") == "replay-text"


def test_local_can_name_a_served_policy_too():
    dep = Deployment.from_env({"ENVFORGE_POLICY_URL": "http://127.0.0.1:8000/v1"})
    assert dep.env == "local" and dep.default_policy.name == "replay" and dep.tier_policy is None
    assert dep.policy_specs == {"replay": "replay", "vllm": "openai:http://127.0.0.1:8000/v1#envforge"}


def test_production_with_everything_set(tmp_path):
    from envforge.rollout.policies.factory import make_policy

    dep = Deployment.from_env({**PROD_ENV, "ENVFORGE_DATA_DIR": str(tmp_path), "ENVFORGE_POLICY_MODEL": "qwen"})
    assert dep.env == "production"
    assert dep.settings.mlflow_tracking_uri == "http://mlflow:5000"
    assert dep.settings.docker_host == "ssh://envforge@sandbox-host"
    spec = "openai:http://vllm:8000/v1#qwen"
    assert dep.default_policy.name == "vllm" and dep.default_policy.spec == spec and dep.tier_policy == spec

    res = default_resources(deployment=dep)
    assert res["mlflow"].tracking_uri == "http://mlflow:5000"
    assert res["docker"].docker_host == "ssh://envforge@sandbox-host"
    policy = res["policy"]
    # Partition keys are short names; the URL only ever appears in the spec they map to.
    assert policy.partition_keys() == ["vllm", "replay"]
    assert all(re.fullmatch(r"[a-z]+", k) for k in policy.partition_keys())
    assert policy.spec_for("vllm") == spec and policy.tier_policy == spec
    served = make_policy(policy.spec_for("vllm"))  # a real client; nothing is contacted until it acts
    assert (served.base_url, served.model) == ("http://vllm:8000/v1", "qwen")


@pytest.mark.parametrize("var", REQUIRED_IN_PRODUCTION)
def test_production_names_a_missing_variable(var, monkeypatch):
    with pytest.raises(DeploymentError, match=rf"{var} is not set: expected") as exc:
        Deployment.from_env({k: v for k, v in PROD_ENV.items() if k != var})
    others = set(REQUIRED_IN_PRODUCTION) - {var}
    assert not any(o in str(exc.value) for o in others), str(exc.value)
    # The same error from what assets/definitions.py calls when the code location loads.
    for k, v in PROD_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv(var)
    with pytest.raises(DeploymentError, match=var):
        default_resources()


def test_production_names_every_missing_variable_at_once():
    with pytest.raises(DeploymentError) as exc:
        Deployment.from_env({"ENVFORGE_ENV": "production"})
    assert all(f"{v} is not set" in str(exc.value) for v in REQUIRED_IN_PRODUCTION)


@pytest.mark.parametrize("var,value,expected", [
    ("MLFLOW_TRACKING_URI", "sqlite:///tmp/mlflow.db", "http(s) URL of the MLflow tracking server"),
    ("MLFLOW_TRACKING_URI", "mlflow:5000", "http(s) URL"),
    ("MLFLOW_TRACKING_URI", "http://", "http(s) URL"),
    ("DOCKER_HOST", "unix:///var/run/docker.sock", "tcp://HOST:PORT or ssh://USER@HOST"),
    ("DOCKER_HOST", "tcp://a:2375,tcp://b:2375", "set ENVFORGE_RAY_ADDRESS to a Ray cluster"),
    ("ENVFORGE_RAY_ADDRESS", "http://ray-head:6379", "HOST:PORT (GCS"),
    ("ENVFORGE_RAY_ADDRESS", "ray-head", "ray://HOST:PORT"),
    ("ENVFORGE_POLICY_URL", "vllm:8000/v1", "OpenAI-compatible server"),
    ("ENVFORGE_POLICY_URL", "ftp://vllm/v1", "OpenAI-compatible server"),
])
def test_production_rejects_a_malformed_variable(var, value, expected):
    with pytest.raises(DeploymentError) as exc:
        Deployment.from_env({**PROD_ENV, var: value})
    message = str(exc.value)
    assert f"{var}={value!r}" in message and expected in message, message


def test_unknown_environment_is_refused():
    with pytest.raises(DeploymentError, match=r"ENVFORGE_ENV='staging': expected one of local, production"):
        Deployment.from_env({"ENVFORGE_ENV": "staging"})


def test_a_malformed_policy_url_is_refused_locally_too():
    with pytest.raises(DeploymentError, match="ENVFORGE_POLICY_URL="):
        Deployment.from_env({"ENVFORGE_POLICY_URL": "localhost:8000"})


# --- the sandbox pool -----------------------------------------------------------------------

SANDBOX_HEAVY = {"ticket_tasks", "review_tasks", "candidate_tasks", "environment_images", "validated_tasks",
                 "tiered_task_set", "rollout_batch", "sft_checkpoint", "rl_checkpoint", "evaluation_report"}
LIGHT = {"spec_tasks", "runbook_tasks", "swebench_tasks", "decontaminated_tasks", "contamination_report"}


def test_sandbox_heavy_assets_share_one_pool():
    from assets.definitions import defs

    graph = defs.resolve_asset_graph()
    ops = {k.to_user_string(): graph.get(k).assets_def.op for k in graph.get_all_asset_keys()}
    pooled = {name for name, op in ops.items() if op.pool}
    assert {op.pool for op in ops.values() if op.pool} == {SANDBOX_POOL}
    assert SANDBOX_HEAVY <= pooled
    assert {name for name, op in ops.items() if op.tags.get("envforge/sandbox-heavy") == "true"} <= pooled
    assert not LIGHT & pooled  # ingesting specs or deduping never waits behind a rollout


def test_the_execution_plan_claims_the_pool():
    """What the executor sees: the steps of main_job that must claim a slot before they start."""
    from dagster._core.execution.api import create_execution_plan

    from assets.definitions import defs

    plan = create_execution_plan(defs.resolve_job_def("main_job"))
    pools = {s.key: s.pool for s in plan.get_all_steps_in_topo_order()}
    assert pools["validated_tasks"] == pools["environment_images"] == SANDBOX_POOL
    assert pools["decontaminated_tasks"] is None


# --- instance configs -----------------------------------------------------------------------

def _instance_from(tmp_path, config: Path | dict):
    import dagster as dg

    home = tmp_path / "dagster_home"
    home.mkdir()
    if isinstance(config, Path):
        shutil.copy(config, home / "dagster.yaml")
    else:
        (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    return dg.DagsterInstance.from_config(str(home))


def test_local_instance_limits_the_sandbox_pool_to_one(tmp_path):
    from dagster._core.instance.config import PoolGranularity
    from dagster._core.run_coordinator import QueuedRunCoordinator

    instance = _instance_from(tmp_path, DEPLOY / "dagster.yaml")
    config = instance.get_concurrency_config()
    assert config.pool_config.default_pool_limit == 1
    assert config.pool_config.pool_granularity == PoolGranularity.OP
    assert isinstance(instance.run_coordinator, QueuedRunCoordinator)
    assert config.run_queue_config.max_concurrent_runs == 2
    assert {"key": "dagster/backfill", "limit": 1} in config.run_queue_config.tag_concurrency_limits
    assert instance.run_monitoring_enabled

    # What the daemon/executor do the first time a step of the pool asks for a slot.
    storage = instance.event_log_storage
    storage.initialize_concurrency_limit_to_default(SANDBOX_POOL)
    info = storage.get_concurrency_info(SANDBOX_POOL)
    assert (info.slot_count, info.using_default_limit) == (1, True)
    assert storage.claim_concurrency_slot(SANDBOX_POOL, "run-a", "rollout_batch").is_claimed
    assert not storage.claim_concurrency_slot(SANDBOX_POOL, "run-b", "validated_tasks").is_claimed
    storage.free_concurrency_slots_for_run("run-a")
    assert storage.claim_concurrency_slot(SANDBOX_POOL, "run-b", "validated_tasks").is_claimed

    # `dagster instance concurrency set envforge-sandbox 2` stores an explicit limit over the default.
    storage.set_concurrency_slots(SANDBOX_POOL, 2)
    info = storage.get_concurrency_info(SANDBOX_POOL)
    assert (info.slot_count, info.using_default_limit) == (2, False)


def test_production_instance_config_validates(tmp_path):
    from dagster._core.errors import DagsterInvalidConfigError
    from dagster._core.instance.config import dagster_instance_config

    home = tmp_path / "prod"
    home.mkdir()
    shutil.copy(PROD / "dagster.yaml", home / "dagster.yaml")
    config, _ = dagster_instance_config(str(home))  # Dagster's own schema check, as at instance load
    assert set(config["storage"]) == {"postgres"}
    assert config["telemetry"] == {"enabled": False}

    # The validator does catch mistakes (so the pass above means something).
    broken = yaml.safe_load((PROD / "dagster.yaml").read_text())
    broken["concurrency"]["pools"]["default_limt"] = 4
    (home / "dagster.yaml").write_text(yaml.safe_dump(broken))
    with pytest.raises(DagsterInvalidConfigError):
        dagster_instance_config(str(home))


def test_production_instance_loads_with_sqlite_in_place_of_postgres(tmp_path):
    """Everything but the storage (no Postgres here) instantiated by Dagster: coordinator, launcher, limits."""
    import dagster as dg
    from dagster._core.run_coordinator import QueuedRunCoordinator

    config = yaml.safe_load((PROD / "dagster.yaml").read_text())
    config["storage"] = {"sqlite": {"base_dir": str(tmp_path / "storage")}}
    instance = _instance_from(tmp_path, config)
    assert isinstance(instance.run_coordinator, QueuedRunCoordinator)
    assert isinstance(instance.run_launcher, dg.DefaultRunLauncher)
    concurrency = instance.get_concurrency_config()
    assert concurrency.pool_config.default_pool_limit == 4
    assert concurrency.run_queue_config.max_concurrent_runs == 8
    instance.event_log_storage.initialize_concurrency_limit_to_default(SANDBOX_POOL)
    assert instance.event_log_storage.get_concurrency_info(SANDBOX_POOL).slot_count == 4


# --- the compose example --------------------------------------------------------------------

def _env_refs(node) -> set[str]:
    if isinstance(node, dict):
        if set(node) == {"env"}:
            return {node["env"]}
        return set().union(*(_env_refs(v) for v in node.values())) if node else set()
    if isinstance(node, list):
        return set().union(*(_env_refs(v) for v in node)) if node else set()
    return set()


def _interpolate(value, variables: dict[str, str]):
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error}, enough for these files."""
    def sub(m: re.Match) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if variables.get(name):
            return variables[name]
        if op == ":?":
            raise KeyError(f"{name} is required: {arg}")
        return arg if op == ":-" else ""
    if isinstance(value, str):
        return re.sub(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", sub, value)
    if isinstance(value, list):
        return [_interpolate(v, variables) for v in value]
    if isinstance(value, dict):
        return {k: _interpolate(v, variables) for k, v in value.items()}
    return value


def _env_example() -> dict[str, str]:
    lines = (PROD / "env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def _compose() -> dict:
    return yaml.safe_load((PROD / "docker-compose.yaml").read_text())


def test_every_deploy_yaml_parses():
    files = [*DEPLOY.glob("*.yaml"), *PROD.glob("*.yaml")]
    assert {f.name for f in files} >= {"dagster.yaml", "docker-compose.yaml", "workspace.yaml"}
    for f in files:
        assert isinstance(yaml.safe_load(f.read_text()), dict), f


def test_env_example_sets_every_required_compose_variable():
    raw = (PROD / "docker-compose.yaml").read_text()
    required = set(re.findall(r"\$\{(\w+):\?", raw))
    assert required == {"POSTGRES_PASSWORD", "ENVFORGE_DOCKER_HOST"}
    assert required <= set(_env_example())


def test_the_code_location_service_is_a_valid_production_deployment():
    services = _interpolate(_compose()["services"], _env_example())
    env = services["envforge"]["environment"]
    dep = Deployment.from_env(env)  # what the code location does when it loads in that container
    assert dep.env == "production" and dep.settings.docker_host == _env_example()["ENVFORGE_DOCKER_HOST"]

    # The URLs it is given point at the services that serve them.
    mlflow_cmd = services["mlflow"]["command"]
    assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000" and "--port=5000" in mlflow_cmd
    assert "--allowed-hosts=mlflow:*,localhost:*,127.0.0.1:*" in mlflow_cmd
    assert any(a.startswith("--artifacts-destination=") for a in mlflow_cmd)
    assert any(a.startswith("--backend-store-uri=postgresql+psycopg2://") for a in mlflow_cmd)  # the image's driver
    vllm = services["vllm"]
    assert env["ENVFORGE_POLICY_URL"] == "http://vllm:8000/v1" and "--port=8000" in vllm["command"]
    assert f"--served-model-name={env['ENVFORGE_POLICY_MODEL']}" in vllm["command"]
    assert dep.default_policy.spec == f"openai:http://vllm:8000/v1#{env['ENVFORGE_POLICY_MODEL']}"
    gpu = vllm["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["capabilities"] == ["gpu"] and gpu["count"] == 1


def test_every_process_that_opens_the_instance_has_its_postgres_variables():
    needed = _env_refs(yaml.safe_load((PROD / "dagster.yaml").read_text()))
    assert needed == {"DAGSTER_PG_HOST", "DAGSTER_PG_PORT", "DAGSTER_PG_DB", "DAGSTER_PG_USERNAME",
                      "DAGSTER_PG_PASSWORD"}
    services = _interpolate(_compose()["services"], _env_example())
    for name in ("envforge", "webserver", "daemon"):
        env = services[name]["environment"]
        assert needed <= set(env), name
        assert env["DAGSTER_HOME"] == "/opt/dagster/dagster_home", name
        assert "./dagster.yaml:/opt/dagster/dagster_home/dagster.yaml:ro" in services[name]["volumes"], name
        assert env["DAGSTER_PG_HOST"] == "postgres" and env["DAGSTER_PG_DB"] == services["postgres"][
            "environment"]["POSTGRES_DB"]


def test_workspace_and_image_agree_on_the_code_location():
    services = _compose()["services"]
    grpc = yaml.safe_load((PROD / "workspace.yaml").read_text())["load_from"][0]["grpc_server"]
    assert grpc["host"] in services and grpc["location_name"] == "envforge"
    assert services[grpc["host"]]["healthcheck"]["test"][-1] == str(grpc["port"])
    for name in ("webserver", "daemon"):
        assert "/opt/dagster/workspace.yaml" in services[name]["command"]

    dockerfile = (PROD / "Dockerfile").read_text()
    local_module = yaml.safe_load((REPO / "workspace.yaml").read_text())["load_from"][0]["python_module"]
    assert f'"-m", "{local_module["module_name"]}"' in dockerfile and f'"-p", "{grpc["port"]}"' in dockerfile
    assert "-c constraints.txt" in dockerfile and "dagster-postgres==" in dockerfile
    assert "-c constraints-gpu.txt" in dockerfile  # EXTRAS=gpu installs against the GPU lock
    assert "ARG BASE=python:3.11-slim-bookworm\nFROM ${BASE}\n" in dockerfile  # a local base where no registry is
    assert (PROD / "Dockerfile.python-base").is_file()
    for svc in services.values():  # every build uses this Dockerfile from the repository root
        if "build" in svc:
            assert (PROD / svc["build"]["context"]).resolve() == REPO.resolve()
            assert (REPO / svc["build"]["dockerfile"]).is_file()
    for svc in services.values():  # and every file it mounts from this folder exists
        for vol in svc.get("volumes", []):
            if vol.startswith("./") and "${" not in vol:
                assert (PROD / vol.split(":")[0]).is_file(), vol


def test_the_image_installs_the_dagster_libraries_of_its_dagster_release():
    """dagster-postgres (instance storage) and dagster-k8s (the K8sRunLauncher platform/deploy/k8s configures)
    at one integration release, the one of the pinned dagster (1.M.P goes with 0.(M+16).P) or, when that is
    not on PyPI yet, an earlier patch of the same minor, installed without its exact dagster requirement."""
    dockerfile = (PROD / "Dockerfile").read_text()
    libs = re.search(r"^ARG DAGSTER_LIBS_VERSION=(\d+)\.(\d+)\.(\d+)$", dockerfile, re.M)
    assert libs, "Dockerfile: ARG DAGSTER_LIBS_VERSION=0.M.P"
    assert '"dagster-postgres==${DAGSTER_LIBS_VERSION}" "dagster-k8s==${DAGSTER_LIBS_VERSION}"' in dockerfile
    pin = re.search(r'"dagster==1\.(\d+)\.(\d+)"', (REPO / "pyproject.toml").read_text())
    assert pin and libs.group(1) == "0" and int(libs.group(2)) == int(pin.group(1)) + 16, (libs.groups(), pin.groups())
    assert int(libs.group(3)) <= int(pin.group(2))
    if int(libs.group(3)) < int(pin.group(2)):  # the exact pair would not resolve, so --no-deps and their own deps
        assert 'pip install --no-deps "dagster-postgres==' in dockerfile and '"kubernetes<37"' in dockerfile
