"""The order-status service: a small HTTP server configured from svc/app.ini.

`python3 svc/server.py --check-config` validates the configuration and exits;
without it the server runs until stopped, answering GET /health with "ok".
"""

from __future__ import annotations

import argparse
import configparser
import http.server
import logging
import sys
from pathlib import Path

CONFIG = Path(__file__).with_name("app.ini")


def load_config(path: Path = CONFIG) -> dict:
    cp = configparser.ConfigParser(inline_comment_prefixes=(";", "#"))
    if not cp.read(path):
        raise SystemExit(f"config {path} not found")
    errors = []
    try:
        port = cp.getint("server", "port")
        if not 1024 <= port <= 65535:
            errors.append(f"server.port {port}: must be 1024-65535 (the service runs unprivileged)")
    except ValueError as exc:
        errors.append(f"server.port: {exc}")
        port = 0
    try:
        workers = cp.getint("server", "workers")
        if workers < 1:
            errors.append("server.workers must be >= 1")
    except ValueError as exc:
        errors.append(f"server.workers: {exc}")
        workers = 0
    log_dir = Path(cp.get("logging", "dir"))
    if not log_dir.is_dir():
        errors.append(f"logging.dir {log_dir} does not exist")
    if errors:
        raise SystemExit("invalid configuration:\n  " + "\n  ".join(errors))
    return {"host": cp.get("server", "host"), "port": port, "workers": workers, "log_dir": log_dir,
            "level": cp.get("logging", "level", fallback="INFO")}


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        ok = self.path == "/health"
        self.send_response(200 if ok else 404)
        self.end_headers()
        self.wfile.write(b"ok\n" if ok else b"not found\n")

    def log_message(self, fmt: str, *args) -> None:
        logging.info(fmt, *args)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check-config", action="store_true")
    args = parser.parse_args()
    cfg = load_config()
    if args.check_config:
        print("config ok")
        return 0
    logging.basicConfig(filename=cfg["log_dir"] / "service.log", level=cfg["level"])
    server = http.server.ThreadingHTTPServer((cfg["host"], cfg["port"]), Health)
    logging.info("listening on %s:%s", cfg["host"], cfg["port"])
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
