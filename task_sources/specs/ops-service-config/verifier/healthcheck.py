"""Start the service from the workspace, probe /health, and stop it again.

Prints 'healthy port=<port>' and exits 0 only when the service answered "ok" and wrote
its log file where the configuration says.
"""

import configparser
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

cp = configparser.ConfigParser(inline_comment_prefixes=(";", "#"))
cp.read("svc/app.ini")
port = cp.getint("server", "port")
log_file = Path(cp.get("logging", "dir")) / "service.log"
proc = subprocess.Popen([sys.executable, "svc/server.py"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
try:
    deadline = time.time() + 10
    while time.time() < deadline:
        if proc.poll() is not None:
            print("service exited:", proc.stdout.read().decode(errors="replace")[-500:])
            sys.exit(1)
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            if body.strip() == b"ok" and log_file.is_file():
                print(f"healthy port={port}")
                sys.exit(0)
        except OSError:
            pass
        time.sleep(0.2)
    print("service did not become healthy within 10s")
    sys.exit(1)
finally:
    proc.kill()
