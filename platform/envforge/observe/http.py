"""Where the metrics go: a /metrics payload for apps that already serve HTTP (the policy server,
the environment service), and a short-lived loopback HTTP server for runs that do not (a rollout
batch, a gate run), started from the environment so the CLI, Python and Dagster runs share it.

    ENVFORGE_METRICS_PORT=9464 envforge rollout ...   # 0: a free port, logged
    ENVFORGE_METRICS_LINGER_S=15                      # keep serving after the run: a last scrape

No push gateway: Prometheus scrapes the run while it lives (docs/observability.md).
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from typing import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, start_http_server

from envforge.observe.metrics import REGISTRY

log = logging.getLogger("envforge.observe")
_active: "MetricsServer | None" = None


def metrics_payload(*extra: CollectorRegistry) -> tuple[bytes, str]:
    """(body, content type) of the process registry plus an app's own registries."""
    return b"".join(generate_latest(r) for r in (REGISTRY, *extra)), CONTENT_TYPE_LATEST


class MetricsServer:
    """The process registry on http://host:port/metrics, in a daemon thread, until `close()`."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1"):
        self._server, self._thread = start_http_server(port, addr=host, registry=REGISTRY)
        self.host, self.port = host, int(self._server.server_port)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}: expected a number, got {raw!r}") from None


@contextmanager
def metrics_server_from_env(what: str = "run") -> Iterator[MetricsServer | None]:
    """Serve the registry for the duration of a run when ENVFORGE_METRICS_PORT is set (else nothing),
    then linger ENVFORGE_METRICS_LINGER_S seconds so the scraper sees the final counts."""
    raw = os.environ.get("ENVFORGE_METRICS_PORT", "").strip()
    if not raw:
        yield None
        return
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(f"environment variable ENVFORGE_METRICS_PORT: expected a port number, got {raw!r}") from None
    global _active
    if _active is not None:  # a run inside a run (a stage calling another): one server per process
        yield _active
        return
    host = os.environ.get("ENVFORGE_METRICS_HOST", "127.0.0.1")
    linger = _env_float("ENVFORGE_METRICS_LINGER_S", 0.0)
    try:
        server = _active = MetricsServer(port, host)
    except OSError as exc:  # the port is taken (another run on this host): the run goes on unobserved
        log.warning("cannot serve this %s's metrics on %s:%s: %s", what, host, port, exc)
        yield None
        return
    log.info("metrics of this %s on %s", what, server.url, extra={"metrics_url": server.url})
    try:
        yield server
    finally:
        if linger > 0:
            time.sleep(linger)
        server.close()
        _active = None
