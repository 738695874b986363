"""Fixtures of the environment-service tests: a data directory with a catalog holding two task sets
(built images recorded), tenants with keys, and a live `envforge service serve` on loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from envforge.config import Settings

REPO = Path(__file__).resolve().parents[2]
SPECS = REPO / "task_sources" / "specs"
SERVED = ("inventory-median-even", "ops-service-config")


@dataclass
class ServiceData:
    settings: Settings
    main_version: str
    private_version: str
    keys: dict[str, str]  # tenant -> key
    tasks: dict  # task id -> Task


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def create_key(settings: Settings, tenant: str, task_sets: list[str] | None = None, **limits) -> str:
    from dataclasses import replace

    from envforge.service.config import TenantLimits
    from envforge.service.tenants import TenantStore, tenants_path

    store = TenantStore(tenants_path(settings))
    try:
        store.upsert_tenant(tenant, task_sets, replace(TenantLimits(), **limits))
        return store.create_key(tenant, "test")[0]
    finally:
        store.close()


@pytest.fixture(scope="session")
def service_data(tmp_path_factory, docker_client, base_image) -> ServiceData:
    from envforge.catalog import Catalog
    from envforge.sandbox.images import build_task_image
    from envforge.sources.result import LoadResult
    from envforge.sources.specs import load_spec_file

    settings = Settings.from_env().with_data_dir(tmp_path_factory.mktemp("service") / "data")
    settings.ensure_dirs()
    tasks = [load_spec_file(SPECS / name / "task.yaml") for name in SERVED]
    cat = Catalog(settings.catalog_path)
    cat.ingest(LoadResult(tasks=tasks))
    cat.record_images([(t, build_task_image(docker_client, t, base_image, settings)) for t in tasks])
    main = cat.create_task_set("main", tasks)
    private = cat.create_task_set("private", tasks[:1])
    keys = {"team-a": create_key(settings, "team-a", ["main"], max_sessions=8),
            "team-b": create_key(settings, "team-b", ["main", "private"], max_sessions=8),
            "tiny": create_key(settings, "tiny", ["main"], max_sessions=1, steps_per_minute=3)}
    return ServiceData(settings, main, private, keys, {t.id: t for t in tasks})


class LiveServer:
    """`envforge service serve` in a subprocess on a free loopback port."""

    def __init__(self, data: ServiceData, port: int | None = None, env: dict[str, str] | None = None):
        self.data = data
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # MLflow off: its import and store migrations cost a server process many seconds of CPU on a
        # 2-core machine; the catalog records every session either way, and test_units logs a batch
        # to a real MLflow store through the same recorder.
        self.env = {**os.environ, "ENVFORGE_DATA_DIR": str(data.settings.data_dir),
                    "ENVFORGE_SERVICE_RECORD_EVERY": "1", "ENVFORGE_SERVICE_MLFLOW": "false", **(env or {})}
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60) -> "LiveServer":
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "envforge.cli", "service", "serve", "--port", str(self.port)],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"service exited {self.proc.returncode}:\n{self.proc.stdout.read()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("service did not become healthy in time")

    def stop(self, sig: int = signal.SIGTERM) -> str:
        if self.proc is None:
            return ""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            output, _ = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            output, _ = self.proc.communicate()
        self.proc = None
        return output or ""


@pytest.fixture(scope="session")
def live_server(service_data):
    server = LiveServer(service_data).start()
    yield server
    server.stop()
