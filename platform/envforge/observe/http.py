"""Where the metrics go: a /metrics payload for apps that already serve HTTP (the policy server,
the environment service), and a short-lived loopback HTTP server for runs that do not (a rollout
batch, a gate run), started from the environment so the CLI, Python and Dagster runs share it.

    ENVFORGE_METRICS_PORT=0 envforge rollout ...      # a free port, registered for Prometheus
    ENVFORGE_METRICS_LINGER_S=15                      # keep serving after the run: a last scrape

Every server registers itself in Prometheus' file_sd directory (`observe.discovery`), so runs on
free ports are found and overlapping runs never clash. A stage of a Dagster run serves on a free
port by default (`ENVFORGE_METRICS_PORT=off` to stop it). No push gateway: Prometheus scrapes
the run while it lives (docs/observability.md).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, start_http_server

from envforge.observe.discovery import Registration, register, targets_dir
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


OFF_VALUES = ("off", "no", "none", "false")


def metrics_port_from_env(default: int | None = None) -> int | None:
    """ENVFORGE_METRICS_PORT as a port (0: a free one), None when unset (then `default`) or off."""
    from envforge.settings import read_env

    raw = read_env().metrics_port
    if raw is None:
        return default
    if raw.lower() in OFF_VALUES:
        return None
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(
            f"environment variable ENVFORGE_METRICS_PORT: expected a port number (0: a free one) or 'off', got {raw!r}"
        ) from None
    if not 0 <= port <= 65535:
        raise ValueError(f"environment variable ENVFORGE_METRICS_PORT: {port} is not a port (0-65535)")
    return port


def start_registered_server(
    role: str,
    what: str,
    labels: dict[str, str] | None = None,
    default_port: int | None = None,
    directory: Path | None = None,
) -> tuple[MetricsServer | None, Registration | None]:
    """The registry served on ENVFORGE_METRICS_PORT (or `default_port`; 0: a free port) of
    ENVFORGE_METRICS_HOST, and its file_sd registration. (None, None) when the port is off; a port
    another process holds or an unwritable directory costs a warning, never the caller."""
    port = metrics_port_from_env(default_port)
    if port is None:
        return None, None
    from envforge.settings import read_env

    host = read_env().metrics_host
    try:
        server = MetricsServer(port, host)
    except OSError as exc:
        log.warning("cannot serve the metrics of this %s on %s:%s: %s", what, host, port, exc)
        return None, None
    try:
        target = register(role, host, server.port, labels, directory)
    except OSError as exc:
        log.warning("cannot register the metrics target of this %s: %s", what, exc)
        target = None
    log.info("metrics of this %s on %s", what, server.url, extra={"metrics_url": server.url})
    return server, target


@contextmanager
def metrics_server_from_env(
    what: str = "run",
    default_port: int | None = None,
    labels: dict[str, str] | None = None,
    data_dir: Path | None = None,
) -> Iterator[MetricsServer | None]:
    """Serve the registry for the duration of a run when ENVFORGE_METRICS_PORT is set (or a
    `default_port` applies: 0 in a Dagster run), registered for Prometheus' file_sd, then linger
    ENVFORGE_METRICS_LINGER_S seconds so the scraper sees the final counts. `labels` become target
    labels next to role=run and stage=<what> (a Dagster run id: one per target, like its port); the
    target goes to `data_dir`'s file_sd directory (default: the environment's data dir)."""
    global _active
    if _active is not None and metrics_port_from_env(default_port) is not None:
        yield _active  # a run inside a run (a stage calling another): one server per process
        return
    from envforge.settings import read_env

    linger = read_env().metrics_linger_s
    server, target = start_registered_server(
        "run", what, {"stage": what, **(labels or {})}, default_port, targets_dir(data_dir)
    )
    if server is None:
        yield None
        return
    _active = server
    try:
        yield server
    finally:
        if linger > 0:
            time.sleep(linger)
        if target is not None:
            target.remove()
        server.close()
        _active = None


@contextmanager
def registered_target(
    role: str, host: str, port: int, labels: dict[str, str] | None = None, directory: Path | None = None
) -> Iterator[None]:
    """A long-running server's registration (the policy server, the environment service) while it serves.

    SIGTERM becomes SystemExit meanwhile: uvicorn, once it has shut down gracefully, raises the signal
    again against the handler it found, and the default one would end the process before the
    registration is removed."""
    import signal
    import sys
    import threading

    try:
        target = register(role, host, port, labels, directory)
    except OSError as exc:
        log.warning("cannot register the %s's metrics target: %s", role, exc)
        target = None
    previous = None
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if target is not None:
            target.remove()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (for servers that must know their port before they bind)."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
