"""A real Prometheus for a test: Debian's binary on a random loopback port with a given config, and
queries against its HTTP API."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_prometheus(workdir: Path, config: dict[str, Any]) -> Iterator[str]:
    """Start Prometheus with `config` (written as JSON, which is YAML) under `workdir`; yields its API base."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing: run platform/deploy/host-packages.sh (Debian's prometheus package)"
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "prometheus.yml"
    path.write_text(json.dumps(config))
    port = free_port()
    log = open(workdir / "prometheus.log", "w")
    proc = subprocess.Popen([binary, f"--config.file={path}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (workdir / "prometheus.log").read_text()[-3000:]
            time.sleep(0.3)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def query(base: str, expr: str) -> list[dict]:
    with urllib.request.urlopen(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}), timeout=10) as r:
        doc = json.load(r)
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


def active_targets(base: str) -> list[dict]:
    with urllib.request.urlopen(f"{base}/api/v1/targets?state=active", timeout=10) as r:
        return json.load(r)["data"]["activeTargets"]


def wait_for(what: str, probe: Callable[[], Any], timeout_s: float = 60.0, every_s: float = 0.5) -> Any:
    """Poll `probe` until it returns something truthy; fail naming `what` and the last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = probe()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: still {got!r} after {timeout_s:.0f} s"
        time.sleep(every_s)
