"""Several replicas of the service on one host behind nginx: `envforge service serve --replicas N`.

One uvicorn process holds its sessions (a sandbox, a `RolloutEnv`) in memory, so a session can
only be served by the process that opened it. The replica set therefore routes by session id:
replica `rK` makes ids `rK.<boot>-<random>` (`ServiceConfig.replica`), and nginx maps the id in
`/sessions/<id>...` to that replica's upstream. Everything else (new sessions, task listings,
health) goes round-robin to the live replicas; a new session is retried on the next replica when
one refuses the connection or answers 503 (full, or its sandbox failed to start: nothing of it
survives on that replica). A request for a session whose replica is gone (connection refused or
cut) gets 410 `session_lost` from nginx, which the client raises as `SessionLost`. Quotas hold
across replicas through the shared store (`shared_quotas`); a killed replica's leases are freed
and its sandboxes removed by the live replicas (their reaper tick).

nginx runs under this process (no system service, no root needed), from a config written into
`<data dir>/service/replicas/` with the replicas' logs and `replicas.json` (names, ports, pids).
A replica that dies is not restarted: its sessions are lost either way, the others keep serving,
and the set stops when nginx or the last replica exits (run it under systemd or Kubernetes for
restarts).
"""

from __future__ import annotations

import contextlib
import grp
import json
import logging
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from envforge.errors import EnvforgeError
from envforge.observe.http import free_port
from envforge.service.config import ServiceConfig

log = logging.getLogger("envforge.service")
NGINX_INSTALL = "install nginx (platform/deploy/host-packages.sh, or apt-get install -y nginx-light)"


@dataclass
class Replica:
    name: str
    port: int
    proc: subprocess.Popen | None = None
    log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the process that started it dies (Linux), so a killed
    `serve --replicas` leaves no replica or nginx running on its own."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def nginx_binary() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
    if found is None:
        raise EnvforgeError(f"serving replicas needs nginx, which is not installed: {NGINX_INSTALL}")
    return found


def _worker_user() -> str:
    """nginx started by root runs its workers as an unprivileged user; otherwise as whoever started it."""
    if os.geteuid() != 0:
        return ""
    nobody = pwd.getpwnam("nobody")
    return f"user nobody {grp.getgrgid(nobody.pw_gid).gr_name};"


def nginx_config(listen: str, replicas: list[Replica], run_dir: Path, max_request_bytes: int) -> str:
    """The proxy in front of `replicas`: session routes to the session's replica, the rest round-robin."""
    servers = "\n".join(f"        server 127.0.0.1:{r.port} max_fails=1 fail_timeout=5s;" for r in replicas)
    # Idle upstream connections are dropped before uvicorn's keep-alive (5 s) closes them: a request
    # sent on a connection the replica is closing would fail for no fault of the replica's.
    one_each = "\n".join(
        f"    upstream replica_{r.name} {{ server 127.0.0.1:{r.port}; keepalive 32; keepalive_timeout 3s; }}"
        for r in replicas
    )
    routes = "\n".join(f"        ~^/sessions/{r.name}\\.  replica_{r.name};" for r in replicas)
    # nginx's own cap above the service's, so the replica answers 413 with its JSON error body.
    body_cap = 2 * max_request_bytes
    temp = "\n".join(
        f"    {kind}_temp_path {run_dir / kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    lost = (
        '{"error": {"code": "session_lost", "message": "session $session_id was lost: the replica of the '
        'service that held it is gone (killed or stopped), and its sandbox with it; start a new session"}}'
    )
    return f"""# Written by `envforge service serve --replicas {len(replicas)}` (envforge.service.replicas).
{_worker_user()}
worker_processes 1;
daemon off;
pid {run_dir / "nginx.pid"};
error_log {run_dir / "nginx-error.log"} warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
{temp}
    client_max_body_size {body_cap};
    client_body_buffer_size {body_cap};   # bodies stay in memory
    proxy_buffering off;                   # and so do responses
    proxy_http_version 1.1;
    proxy_set_header Host $host;
    proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
    proxy_set_header Upgrade $http_upgrade;            # the OpenEnv WebSocket
    proxy_set_header Connection $connection_upgrade;
    proxy_connect_timeout 5s;
    proxy_read_timeout 3600s;                          # a terminal step grades the episode
    proxy_send_timeout 3600s;

    map $http_upgrade $connection_upgrade {{
        default upgrade;
        ""      "";
    }}
    upstream replicas {{
{servers}
        keepalive 64;
        keepalive_timeout 3s;
    }}
{one_each}
    map $uri $session_upstream {{
{routes}
        default replicas;
    }}

    server {{
        listen {listen};
        location / {{
            proxy_pass http://replicas;
        }}
        # A new session may go to the next replica when one is down or full: nothing of it stays there.
        location = /sessions {{
            proxy_pass http://replicas;
            proxy_next_upstream error timeout http_503 non_idempotent;
        }}
        # A session's requests go to its replica only; a gone replica is a lost session. (With one
        # server, `error` retries only a request whose reused keep-alive connection failed, on a new one.)
        location ~ ^/sessions/(?<session_id>[A-Za-z0-9._-]+) {{
            proxy_pass http://$session_upstream;
            proxy_next_upstream error non_idempotent;
            error_page 502 = @session_lost;
        }}
        location @session_lost {{
            default_type application/json;
            return 410 '{lost}';
        }}
    }}
}}
"""


class ReplicaSet:
    """N `envforge service serve` processes on loopback ports and nginx on `config.host:config.port`."""

    def __init__(self, config: ServiceConfig, count: int, run_dir: Path, data_dir: Path | None = None):
        if count < 1:
            raise EnvforgeError(f"--replicas must be at least 1, got {count}")
        self.config, self.run_dir, self.data_dir = config, run_dir, data_dir
        self.nginx = nginx_binary()
        self.replicas = [Replica(f"r{i}", free_port("127.0.0.1")) for i in range(count)]
        self.proxy: subprocess.Popen | None = None
        self.reported_dead: set[str] = set()

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    def start(self, timeout_s: float = 180.0) -> "ReplicaSet":
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            for r in self.replicas:
                self._start_replica(r)
            deadline = time.monotonic() + timeout_s
            for r in self.replicas:
                self._wait_healthy(r.url, r, deadline)
            conf = self.run_dir / "nginx.conf"
            conf.write_text(
                nginx_config(
                    f"{self.config.host}:{self.config.port}", self.replicas, self.run_dir, self.config.max_request_bytes
                )
            )
            self.proxy = subprocess.Popen(
                [self.nginx, "-p", str(self.run_dir), "-c", str(conf), "-e", str(self.run_dir / "nginx-error.log")],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches this process only: it stops the set in order
                preexec_fn=_die_with_parent,
            )
            self._wait_healthy(self.url, None, deadline)
        except BaseException:
            self.stop()
            raise
        (self.run_dir / "replicas.json").write_text(json.dumps(self.describe(), indent=2) + "\n")
        return self

    def _start_replica(self, r: Replica) -> None:
        cmd = [sys.executable, "-m", "envforge.cli", "service", "serve", "--host", "127.0.0.1", "--port", str(r.port)]
        if self.data_dir:
            cmd += ["--data-dir", str(self.data_dir)]
        r.log = open(self.run_dir / f"{r.name}.log", "ab")
        env = {
            **os.environ,
            "ENVFORGE_SERVICE_REPLICA": r.name,
            "ENVFORGE_SERVICE_LEASE_TTL_S": str(self.config.lease_ttl_s),
        }
        r.proc = subprocess.Popen(
            cmd, env=env, stdout=r.log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent
        )

    def _wait_healthy(self, url: str, r: Replica | None, deadline: float) -> None:
        proc, what = (r.proc, f"replica {r.name}") if r else (self.proxy, "nginx")
        logfile = self.run_dir / (f"{r.name}.log" if r else "nginx-error.log")
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                tail = logfile.read_text(errors="replace")[-2000:] if logfile.exists() else ""
                raise EnvforgeError(f"{what} exited with code {proc.returncode} at start ({logfile}):\n{tail}")
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise EnvforgeError(f"{what} did not answer {url}/healthz in time (log: {logfile})")

    def describe(self) -> dict:
        return {
            "url": self.url,
            "nginx_pid": self.proxy.pid if self.proxy else None,
            "replicas": [
                {"name": r.name, "url": r.url, "pid": r.proc.pid if r.proc else None, "alive": self._alive(r)}
                for r in self.replicas
            ],
        }

    @staticmethod
    def _alive(r: Replica) -> bool:
        return r.proc is not None and r.proc.poll() is None

    def check(self) -> bool:
        """Report replicas that died since the last check; False once nothing can serve any more."""
        for r in self.replicas:
            if r.proc is not None and not self._alive(r) and r.name not in self.reported_dead:
                self.reported_dead.add(r.name)
                log.warning(
                    "replica %s exited with code %s; its sessions answer 410 session_lost, new sessions go to "
                    "the %d live replica(s)",
                    r.name,
                    r.proc.returncode,
                    sum(self._alive(x) for x in self.replicas),
                )
        proxy_up = self.proxy is not None and self.proxy.poll() is None
        return proxy_up and any(self._alive(r) for r in self.replicas)

    def serve_forever(self) -> None:
        while self.check():
            time.sleep(0.5)

    def stop(self) -> None:
        """nginx first (no new requests), then each replica gracefully (it closes its sessions)."""
        if self.proxy is not None and self.proxy.poll() is None:
            self.proxy.send_signal(signal.SIGQUIT)
        for r in self.replicas:
            if self._alive(r):
                r.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        for p in [self.proxy, *(r.proc for r in self.replicas)]:
            if p is None:
                continue
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for r in self.replicas:
            if r.log:
                r.log.close()
