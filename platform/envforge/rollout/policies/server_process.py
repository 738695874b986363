"""An `envforge policy serve` child process on a loopback port, owned by whoever started it.

Asynchronous training rolls out through a policy in its own process (`TrainingConfig.rollout_policy
= "served"`): sampling and the trainer's updates then hold separate interpreters (no GIL shared
between the sampling loop and the backward pass) and separate torch thread budgets (torch's
intra-op thread count is per process), which is how the two sides also run when the policy is
`vllm serve` on other hardware. The process is started on a checkpoint directory, fresh
(policy version 0), and stopped by `close()`. Its log (uvicorn writes a line per request) goes
to `log_path`, a file rather than a pipe nobody drains, which would stall the server once full.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from envforge.observe.http import free_port


@dataclass
class PolicyServerProcess:
    """`python -m envforge.rollout.policies.serve CHECKPOINT` on 127.0.0.1 with `threads` torch threads."""

    checkpoint: Path
    threads: int = 0
    start_timeout_s: float = 180.0
    log_path: Path | None = None  # default: <checkpoint>.server.log beside the checkpoint
    port: int = 0
    _proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible root (`.../v1`)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "PolicyServerProcess":
        """Start the server and wait until /health answers; a server that exits early raises with its log tail."""
        for _attempt in range(3):  # a port picked free can be taken before the server binds it
            self.port = free_port()
            cmd = [
                sys.executable,
                "-m",
                "envforge.rollout.policies.serve",
                str(self.checkpoint),
                "--port",
                str(self.port),
                "--threads",
                str(self.threads),
            ]
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            if self.threads > 0:
                env["OMP_NUM_THREADS"] = str(self.threads)
            log_path = Path(self.log_path or f"{self.checkpoint}.server.log")
            with open(log_path, "wb") as log:
                self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            if self._wait_healthy():
                return self
            err = log_path.read_text(errors="replace")[-2000:]
            if "address already in use" not in err.lower():
                raise RuntimeError(f"policy server on {self.checkpoint} did not start: {err or 'no output'}")
        raise RuntimeError(f"policy server on {self.checkpoint}: no free port after 3 attempts")

    def _wait_healthy(self) -> bool:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as resp:
                    json.loads(resp.read())
                return True
            except OSError:
                time.sleep(0.25)
        self.close()
        raise RuntimeError(f"policy server on {self.checkpoint} not healthy after {self.start_timeout_s:.0f} s")

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
