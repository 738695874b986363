"""A multi-node Ray cluster on one machine, for the fleet demo, its test and the benchmark.

Real Ray processes (a GCS and a raylet per node, all on this machine's own address), started with Ray's own
`cluster_utils.Cluster`: a head that holds no sandboxes, and worker nodes that each advertise
sandbox capacity and carry their own `DOCKER_HOST`, so each node agent drives its own engine
(`platform/deploy/fleet-engine.sh` starts extra engines; a node may also use the main one).
`kill_node` SIGKILLs a node's raylet and its workers: to the rest of the cluster, a host died.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envforge.config import checkout_root
from envforge.fleet.config import FleetConfig

ENGINE_SCRIPT = "platform/deploy/fleet-engine.sh"


def start_engine(name: str) -> str:
    """Start (or find) the extra Docker engine of a simulated node; returns its DOCKER_HOST."""
    script = checkout_root() / ENGINE_SCRIPT
    proc = subprocess.run([str(script), "start", name], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{ENGINE_SCRIPT} start {name} failed:\n{proc.stderr[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]


def stop_engine(name: str) -> None:
    subprocess.run([str(checkout_root() / ENGINE_SCRIPT), "stop", name], capture_output=True, text=True)


@dataclass
class LocalCluster:
    """Head + worker nodes on loopback. Use as a context manager."""

    config: FleetConfig = field(default_factory=FleetConfig)
    object_store_mb: int = 600
    nodes: dict[str, Any] = field(default_factory=dict)
    _cluster: Any = None

    def start(self) -> str:
        import os

        os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # no usage report leaves this machine
        from ray.cluster_utils import Cluster

        self._cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "include_dashboard": False,
                "node_name": "head",
                "object_store_memory": self.object_store_mb << 20,
            },
        )
        import logging

        import ray

        ray.init(
            address=self.address,
            namespace=self.config.namespace,
            log_to_driver=False,
            logging_level=logging.WARNING,
            configure_logging=False,
        )
        return self.address

    @property
    def address(self) -> str:
        return self._cluster.address

    def add_node(self, name: str, docker_host: str | None, capacity: int, wait: bool = True) -> Any:
        env = {"DOCKER_HOST": docker_host} if docker_host else {}
        node = self._cluster.add_node(
            wait=wait,
            num_cpus=1,
            node_name=name,
            env_vars=env,
            resources={self.config.node_resource: capacity},
            object_store_memory=self.object_store_mb << 20,
        )
        self.nodes[name] = node
        return node

    def kill_node(self, name: str) -> None:
        """SIGKILL the node's raylet and workers: the node is gone, as if its host died."""
        self._cluster.remove_node(self.nodes.pop(name), allow_graceful=False)

    def shutdown(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        if self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None

    def __enter__(self) -> "LocalCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def engine_names(n: int) -> list[str]:
    return [f"node-{chr(ord('a') + i)}" for i in range(n)]


def script_path() -> Path:
    return checkout_root() / ENGINE_SCRIPT


def own_engines(names: list[str]) -> dict[str, str]:
    """Start one extra engine per simulated node; {node name: its DOCKER_HOST}."""
    return {name: start_engine(name) for name in names}
