"""Allow-listed egress for the few tasks whose spec asks for it.

Sandboxes have no network at all by default. A task with `network: {mode: allowlist,
allow: [host:port, ...]}` gets a sandbox on a dedicated bridge (`envforge-allowlist`,
inter-container traffic off) whose traffic is dropped on the host unless it goes to one of
the allowed address:port pairs. The rules live in an iptables chain that both FORWARD
traffic (via Docker's DOCKER-USER hook) and traffic to the host itself (INPUT) pass through,
so the host's own services are unreachable too. Needs root and a local engine.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
from dataclasses import dataclass, field

import docker
from docker.errors import NotFound

from envforge.errors import InfraError
from envforge.sandbox.engine import MANAGED_LABEL
from envforge.task import NetworkPolicy

ALLOWLIST_NETWORK = "envforge-allowlist"
CHAIN = "ENVFORGE-ALLOW"
_setup_lock = threading.Lock()


def _iptables(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    binary = shutil.which("iptables")
    if binary is None:
        raise InfraError("allowlist_unavailable", "iptables is not installed on the engine host")
    proc = subprocess.run([binary, "-w", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise InfraError("allowlist_rules_failed", f"iptables {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def _ensure_jump(table_chain: str, subnet: str) -> None:
    if _iptables("-C", table_chain, "-s", subnet, "-j", CHAIN, check=False).returncode != 0:
        _iptables("-I", table_chain, "1", "-s", subnet, "-j", CHAIN)


def ensure_allowlist_network(client: docker.DockerClient) -> str:
    """Create the bridge and the default-deny chain once; returns the network's subnet."""
    with _setup_lock:
        try:
            net = client.networks.get(ALLOWLIST_NETWORK)
        except NotFound:
            net = client.networks.create(
                ALLOWLIST_NETWORK,
                driver="bridge",
                labels={MANAGED_LABEL: "1"},
                options={"com.docker.network.bridge.enable_icc": "false"},
            )
            net.reload()
        subnet = net.attrs["IPAM"]["Config"][0]["Subnet"]
        if _iptables("-S", CHAIN, check=False).returncode != 0:
            _iptables("-N", CHAIN)
        if _iptables("-C", CHAIN, "-j", "DROP", check=False).returncode != 0:
            _iptables("-A", CHAIN, "-j", "DROP")
        _ensure_jump("DOCKER-USER", subnet)
        _ensure_jump("INPUT", subnet)
        return subnet


def resolve(entry: str) -> list[tuple[str, int]]:
    host, _, port = entry.rpartition(":")
    try:
        infos = socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)
    except OSError as exc:
        raise InfraError("allowlist_resolve_failed", f"{entry}: {exc}") from None
    return sorted({(info[4][0], int(port)) for info in infos})


@dataclass
class AllowlistRules:
    """The accept rules of one sandbox; `release()` removes them."""

    source_ip: str
    rules: list[list[str]] = field(default_factory=list)

    def release(self) -> None:
        for rule in self.rules:
            _iptables("-D", CHAIN, *rule, check=False)
        self.rules.clear()


def attach_allowlist(client: docker.DockerClient, container, policy: NetworkPolicy) -> AllowlistRules:
    """Open exactly the allowed address:port pairs for a started container on the allow-list bridge."""
    container.reload()
    ip = container.attrs["NetworkSettings"]["Networks"][ALLOWLIST_NETWORK]["IPAddress"]
    rules = AllowlistRules(ip)
    try:
        for entry in policy.allow:
            for addr, port in resolve(entry):
                rule = ["-s", ip, "-d", addr, "-p", "tcp", "--dport", str(port), "-j", "RETURN"]
                _iptables("-I", CHAIN, "1", *rule)
                rules.rules.append(rule)
    except BaseException:
        rules.release()
        raise
    return rules
