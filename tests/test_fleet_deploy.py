"""The fleet's deployment files: the Kubernetes manifests validate against the Kubernetes schemas
(kubernetes-validate, which ships them: no download) and pass `kubectl apply --dry-run=client`,
the compose overlay wires the code location to the Ray head, and the node entrypoint parses.

kubectl's client-side dry run still asks an API server which kinds exist (discovery) and
whether each object exists; no cluster is reachable here, so the test serves exactly that on
loopback: the discovery documents of the API groups the manifests use (core, apps, RBAC, and
KubeRay's ray.io/v1) and 404 for every object. kubectl then parses every manifest, maps each
kind to its resource and reports what it would create."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

K8S = REPO / "platform" / "deploy" / "k8s"
PROD = REPO / "platform" / "deploy" / "production"
RESOURCES = {  # group/version -> (kind, plural, namespaced)
    "v1": [("Namespace", "namespaces", False), ("ConfigMap", "configmaps", True), ("Secret", "secrets", True),
           ("ServiceAccount", "serviceaccounts", True), ("Service", "services", True)],
    "apps/v1": [("Deployment", "deployments", True)],
    "rbac.authorization.k8s.io/v1": [("Role", "roles", True), ("RoleBinding", "rolebindings", True)],
    "ray.io/v1": [("RayCluster", "rayclusters", True)],
}


class _Discovery(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/api":
            return self._send(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
        if path == "/apis":
            groups = [{"name": gv.split("/")[0], "versions": [{"groupVersion": gv, "version": gv.split("/")[1]}],
                       "preferredVersion": {"groupVersion": gv, "version": gv.split("/")[1]}}
                      for gv in RESOURCES if "/" in gv]
            return self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        for gv, kinds in RESOURCES.items():
            if path == ("/api/v1" if gv == "v1" else f"/apis/{gv}"):
                return self._send(200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
                                        "resources": [{"name": plural, "singularName": kind.lower(), "kind": kind,
                                                       "namespaced": ns, "verbs": ["create", "get", "list", "patch"]}
                                                      for kind, plural, ns in kinds]})
        self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                         "code": 404, "message": f"{path} not found"})


@pytest.fixture
def api_server(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Discovery)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "dry",
        "clusters": [{"name": "dry", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
        "contexts": [{"name": "dry", "context": {"cluster": "dry", "user": "dry"}}],
        "users": [{"name": "dry", "user": {}}]}))
    yield kubeconfig
    server.shutdown()


def test_kubernetes_manifests_pass_kubectl_client_dry_run(api_server, tmp_path):
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is missing: run platform/deploy/host-packages.sh (installs kubernetes-client)"
    files = sorted(K8S.glob("*.yaml"))
    docs = [d for f in files for d in yaml.safe_load_all(f.read_text()) if d]
    proc = subprocess.run([kubectl, "--kubeconfig", str(api_server), "--cache-dir", str(tmp_path / "cache"),
                           "apply", "--dry-run=client", "--validate=false", "-f", str(K8S)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    created = [line for line in proc.stdout.splitlines() if line.endswith("created (dry run)")]
    assert len(created) == len(docs), proc.stdout
    kinds = {d["kind"] for d in docs}
    assert {"RayCluster", "Deployment", "ConfigMap", "Secret"} <= kinds


# The oldest Kubernetes minor still supported upstream when this was written, and the newest the validator
# ships: a field removed or added in between fails one of them.
K8S_VERSIONS = ("1.32", "1.37")


def _manifests() -> list[tuple[str, dict]]:
    return [(f.name, d) for f in sorted(K8S.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def _pod_templates(cluster: dict) -> list[tuple[str, dict]]:
    """A RayCluster's pod templates as core v1 PodTemplates: KubeRay's CRD schema ships in no package this
    machine can install (its Helm chart is not on PyPI, npm or Debian), so the CRD's own fields are left to
    the kubectl dry run and the test below, and what runs, its pods, is validated as Kubernetes' own type."""
    groups = [("head", cluster["spec"]["headGroupSpec"])]
    groups += [(g["groupName"], g) for g in cluster["spec"]["workerGroupSpecs"]]
    return [(name, {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": g["template"]})
            for name, g in groups]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_kubernetes_manifests_validate_against_the_kubernetes_schemas(version):
    import kubernetes_validate

    checked = []
    for name, doc in _manifests():
        docs = _pod_templates(doc) if doc["kind"] == "RayCluster" else [(doc["metadata"]["name"], doc)]
        for what, d in docs:
            try:  # strict: a misspelt or misplaced field is an error, not ignored
                kubernetes_validate.validate(d, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                raise AssertionError(f"{name}: {d['kind']} {what}: {exc.message} at {list(exc.path)}") from None
            checked.append(d["kind"])
    assert {"Namespace", "ConfigMap", "Secret", "ServiceAccount", "Role", "RoleBinding", "Deployment", "Service",
            "PodTemplate"} == set(checked)
    assert checked.count("PodTemplate") == 2  # the head and the sandbox-node group


def test_the_schema_validator_catches_what_kubectl_client_dry_run_lets_through():
    import kubernetes_validate

    deployment = next(d for _, d in _manifests() if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    kubernetes_validate.validate(deployment, K8S_VERSIONS[-1], strict=True)
    container["imagePullPolcy"] = "IfNotPresent"  # a typo: an apply would drop it silently
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[-1], strict=True)
    del container["imagePullPolcy"]
    container["ports"][0]["containerPort"] = "4000"  # a string where the API wants an integer
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[-1], strict=True)


def test_the_raycluster_gives_every_worker_its_own_engine_and_sandbox_capacity():
    cluster = yaml.safe_load((K8S / "raycluster.yaml").read_text())
    workers = cluster["spec"]["workerGroupSpecs"][0]
    assert "envforge_sandboxes" in workers["rayStartParams"]["resources"]
    pod = workers["template"]["spec"]
    ray = next(c for c in pod["containers"] if c["name"] == "ray-worker")
    engine = next(c for c in pod["containers"] if c["name"] == "engine")
    assert {"name": "DOCKER_HOST", "value": "tcp://localhost:2375"} in ray["env"]
    assert engine["securityContext"]["privileged"] and "--bridge=none" in engine["args"]
    assert cluster["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"  # no sandboxes on the head
    config = next(yaml.safe_load_all((K8S / "config.yaml").read_text()))
    assert config["data"]["ENVFORGE_RAY_ADDRESS"].startswith(f"ray://{cluster['metadata']['name']}-head-svc")
    assert config["data"]["ENVFORGE_RAY_ADDRESS"].endswith(":10001")  # the head's `client` port
    instance = yaml.safe_load(next(d for d in yaml.safe_load_all((K8S / "code-location.yaml").read_text())
                                   if d["kind"] == "ConfigMap")["data"]["dagster.yaml"])
    assert instance["run_launcher"]["class"] == "K8sRunLauncher"
    assert "envforge-env" in instance["run_launcher"]["config"]["env_config_maps"]


def test_the_compose_overlay_sends_the_code_location_and_the_service_to_the_ray_head():
    from envforge.deployment import Deployment

    overlay = yaml.safe_load((PROD / "docker-compose.fleet.yaml").read_text())["services"]
    # Neither container is a Ray node, so both join through the head's Ray Client server.
    assert overlay["envforge"]["environment"]["ENVFORGE_RAY_ADDRESS"] == "ray://ray-head:10001"
    assert overlay["service"]["environment"]["ENVFORGE_RAY_ADDRESS"] == "ray://ray-head:10001"  # sessions too
    assert {"--head", "--ray-client-server-port=10001"} <= set(overlay["ray-head"]["command"])
    assert overlay["ray-worker"]["environment"]["ENVFORGE_RAY_ADDRESS"] == "ray-head:6379"  # a node joins the GCS
    assert overlay["ray-worker"]["privileged"]
    assert "volumes" not in overlay["ray-worker"]  # two engines must never share a data root
    Deployment.from_env({"ENVFORGE_ENV": "production", "MLFLOW_TRACKING_URI": "http://mlflow:5000",
                         "DOCKER_HOST": "tcp://builder:2375", "ENVFORGE_POLICY_URL": "http://vllm:8000/v1",
                         "ENVFORGE_RAY_ADDRESS": overlay["envforge"]["environment"]["ENVFORGE_RAY_ADDRESS"]})
    for script in (PROD / "fleet-node.sh", REPO / "platform" / "deploy" / "fleet-engine.sh"):
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
