"""How Prometheus finds envforge's processes: each process that serves /metrics writes one file
into a Prometheus `file_sd` directory, and removes it when it stops.

    <data_dir>/observe/targets/envforge-<role>-<hostname>-<pid>-<port>.json
    [{"targets": ["127.0.0.1:41231"], "labels": {"role": "run", "stage": "rollout", ...}}]

A fixed port cannot serve two overlapping runs (two Dagster runs, a CLI rollout next to a gate
run), and a free port (0) is useless to a scraper that is not told it: a registration file is how
it is told. Prometheus watches the directory (`file_sd_configs`, see `prometheus_config`), so a
run's target appears when it starts and disappears when it ends.

Files are written atomically (a dot-file renamed into place: Prometheus never reads half a file)
and removed on close and at interpreter exit; a process killed without either leaves its file,
so every registration first prunes the files of this host's dead processes (pid gone, or reused
by a process that started later). `ENVFORGE_METRICS_TARGETS_DIR` moves the directory (a
directory shared by several hosts works: each host prunes only its own entries).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import threading
from pathlib import Path
from typing import Any, Mapping

from envforge.safefs import write_atomic

log = logging.getLogger("envforge.observe")
PREFIX = "envforge-"
ROLES = frozenset({"run", "policy_server", "env_service", "fleet_node"})
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


def targets_dir(data_dir: Path | None = None) -> Path:
    """The file_sd directory: ENVFORGE_METRICS_TARGETS_DIR, else <data_dir>/observe/targets (the
    given data dir, or the environment's)."""
    from envforge.settings import read_env

    configured = read_env().metrics_targets_dir
    if configured is not None:
        return configured.expanduser().resolve()
    if data_dir is None:
        from envforge.config import Settings

        data_dir = Settings.from_env().data_dir
    return Path(data_dir) / "observe" / "targets"


def _process_started(pid: int) -> str | None:
    """The kernel's start time of `pid` (field 22 of /proc/<pid>/stat), None when no such process.
    With the pid it names one process even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:  # no /proc here (not Linux): fall back to "does the pid exist"
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def advertised_host(host: str) -> str:
    """The address a scraper should use for a server bound to `host` (a wildcard bind: this host's name)."""
    return socket.getfqdn() if host in _WILDCARD_HOSTS else host


class Registration:
    """One process's target file; `remove()` (also run at exit) takes it out of Prometheus' view."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        atexit.register(self.remove)

    def remove(self) -> None:
        with self._lock:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
        atexit.unregister(self.remove)


def register(
    role: str, host: str, port: int, labels: Mapping[str, str] | None = None, directory: Path | None = None
) -> Registration:
    """Write this process's target (`host:port` serving /metrics) with `role` and `labels` as target
    labels. Label values should come from small sets (a stage name, a node name): they end up on
    every series of the target."""
    if role not in ROLES:
        raise ValueError(f"metrics target role {role!r}: expected one of {sorted(ROLES)}")
    directory = directory or targets_dir()
    directory.mkdir(parents=True, exist_ok=True)
    prune(directory)
    pid, hostname = os.getpid(), socket.gethostname()
    doc: list[dict[str, Any]] = [
        {
            "targets": [f"{advertised_host(host)}:{int(port)}"],
            "labels": {
                "role": role,
                "hostname": hostname,
                "pid": str(pid),
                # "__" labels are dropped after relabelling: kept in the file only, for `prune`
                "__process_started": _process_started(pid) or "",
                **{k: str(v) for k, v in (labels or {}).items()},
            },
        }
    ]
    path = directory / f"{PREFIX}{role}-{hostname}-{pid}-{int(port)}.json"
    write_atomic(path, json.dumps(doc, indent=1))  # its temporary dot-file is not *.json: Prometheus ignores it
    log.info("metrics target %s:%s registered in %s", host, port, path, extra={"metrics_target": str(path)})
    return Registration(path)


def prune(directory: Path | None = None) -> list[Path]:
    """Remove the target files of this host's processes that are gone; returns what was removed.
    Files of other hosts and files that are not envforge's are left alone."""
    directory = directory or targets_dir()
    hostname, removed = socket.gethostname(), []
    for path in sorted(directory.glob(f"{PREFIX}*.json")):
        try:
            labels = json.loads(path.read_text())[0]["labels"]
            pid, started = int(labels["pid"]), labels.get("__process_started", "")
            if labels.get("hostname") != hostname:
                continue
        except FileNotFoundError:
            continue  # its owner removed it meanwhile
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            log.warning("metrics target file %s is not an envforge registration; left alone", path)
            continue
        now = _process_started(pid)
        if now is None or (started and now and now != started):
            try:
                path.unlink()
                removed.append(path)
            except FileNotFoundError:
                pass
    return removed


def prometheus_config(
    targets: str | Path, rules: str | Path | None = None, scrape_interval_s: float = 5.0, job: str = "envforge"
) -> dict[str, Any]:
    """A Prometheus configuration that scrapes every registered envforge process (and loads the
    alert rules): what platform/deploy/observability/prometheus.yml is, for another directory.
    Prometheus watches the directory for changes if it exists when it starts (else it finds new
    files at the next refresh, 5 s): `envforge observe prometheus-config` creates it."""
    interval = f"{scrape_interval_s:g}s"
    config: dict[str, Any] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {
                "job_name": job,
                "file_sd_configs": [{"files": [f"{str(targets).rstrip('/')}/*.json"], "refresh_interval": "5s"}],
            }
        ],
    }
    if rules is not None:
        config["rule_files"] = [str(rules)]
    return config
