"""Benchmark `envforge policy serve` under concurrent clients: batched vs one request at a time.

    .venv/bin/python bench/policy_serve.py [--clients C] [--requests R] [--max-tokens M] [--rounds K]
                                           [--hidden H --layers L] [--threads T] [--out FILE]

Builds a tiny checkpoint (`policies/tiny.py`, `--hidden`/`--layers` to make it heavier) and
starts two servers on it, each with `--threads T` torch threads: `batched` (`--max-batch C`)
and `serialized` (`--max-batch 1`, the server as it was: one generation at a time). Each
round, C concurrent openai-SDK clients send R chat requests in all (the same seeds and
prompts for both servers, so both sample the same tokens) to one server, then the other
(the order alternates per round, so both see the same machine load). Prints one JSON
document: per mode and round requests/s, completion tokens/s, p50 and p90 latency, the
server's batch sizes; medians over rounds; and the batched/serialized ratios of the medians.
Everything stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "platform"))

import openai  # noqa: E402

from envforge.observe.http import free_port  # noqa: E402
from envforge.rollout.actions import TOOLS  # noqa: E402
from envforge.rollout.policies.tiny import TinyModelConfig, build_tiny_model, save_pretrained_dir  # noqa: E402

PROMPTS = ["The tests fail. Fix them.", "Make the function return 0 for an empty list.",
           "exit code 1\nFAILED tests/test_app.py::test_empty", "Read src/app/main.py and fix the bug."]


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


class Server:
    """`python -m envforge.rollout.policies.serve CKPT --max-batch B` on a free loopback port."""

    def __init__(self, ckpt: Path, max_batch: int, threads: int, log_path: Path) -> None:
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": str(REPO / "platform"), "OMP_NUM_THREADS": str(threads),
               "PYTHONUNBUFFERED": "1"}
        with open(log_path, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "envforge.rollout.policies.serve", str(ckpt),
                                          "--port", str(self.port), "--threads", str(threads),
                                          "--max-batch", str(max_batch)], stdout=out, stderr=subprocess.STDOUT,
                                         env=env)
        deadline = time.monotonic() + 180
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start: {log_path.read_text()[-2000:]}")
            try:
                self.health()
                return
            except OSError:
                time.sleep(0.25)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def health(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as resp:
            return json.loads(resp.read())

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


async def load(server: Server, clients: int, requests: int, max_tokens: int) -> dict:
    """C workers pulling from R requests; requests/s, tokens/s and latency percentiles."""
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=600)
    todo = list(range(requests))
    latencies: list[float] = []
    tokens = 0
    before = server.health()["batching"]

    async def worker() -> None:
        nonlocal tokens
        while todo:
            i = todo.pop()
            messages = [{"role": "system", "content": "You fix bugs."},
                        {"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]
            start = time.perf_counter()
            out = await client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, seed=i,
                                                       max_tokens=max_tokens, temperature=1.0)
            latencies.append(time.perf_counter() - start)
            tokens += out.usage.completion_tokens

    start = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(clients)))
    finally:
        await client.close()
    wall = time.perf_counter() - start
    after = server.health()["batching"]
    batches = after["seen_batches"] - before["seen_batches"]
    return {"wall_s": round(wall, 3), "requests_per_s": round(requests / wall, 3),
            "tokens_per_s": round(tokens / wall, 1), "completion_tokens": tokens,
            "p50_latency_s": round(statistics.median(latencies), 4), "p90_latency_s": round(pct(latencies, 0.9), 4),
            "batches": batches, "mean_batch_rows": round((after["seen_rows"] - before["seen_rows"]) / batches, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-policy-serve-") as tmp:
        model, tok = build_tiny_model(TinyModelConfig(hidden_size=a.hidden, num_layers=a.layers,
                                                      intermediate=2 * a.hidden))
        ckpt = save_pretrained_dir(model, tok, Path(tmp) / "ckpt")
        servers = {"batched": Server(ckpt, a.clients, a.threads, Path(tmp) / "batched.log"),
                   "serialized": Server(ckpt, 1, a.threads, Path(tmp) / "serialized.log")}
        try:
            for name, server in servers.items():  # warm-up: first-call costs out of the timed rounds
                asyncio.run(load(server, 2, 2, 4))
            rounds: dict[str, list[dict]] = {name: [] for name in servers}
            for k in range(a.rounds):
                order = list(servers) if k % 2 == 0 else list(reversed(servers))
                for name in order:
                    result = asyncio.run(load(servers[name], a.clients, a.requests, a.max_tokens))
                    log(f"round {k} {name}: {result}")
                    rounds[name].append(result)
        finally:
            for server in servers.values():
                server.close()

    keys = ("requests_per_s", "tokens_per_s", "p50_latency_s", "p90_latency_s", "mean_batch_rows")
    medians = {name: {key: statistics.median(r[key] for r in rs) for key in keys} for name, rs in rounds.items()}
    b, s = medians["batched"], medians["serialized"]
    report = {
        "config": {"clients": a.clients, "requests": a.requests, "max_tokens": a.max_tokens, "rounds": a.rounds,
                   "model": f"tiny {a.hidden}x{a.layers}", "server_threads": a.threads, "cpus": os.cpu_count()},
        "rounds": rounds, "medians": medians,
        "ratios_batched_over_serialized": {
            "requests_per_s": round(b["requests_per_s"] / s["requests_per_s"], 3),
            "tokens_per_s": round(b["tokens_per_s"] / s["tokens_per_s"], 3),
            "p50_latency_s": round(b["p50_latency_s"] / s["p50_latency_s"], 3)},
    }
    text = json.dumps(report, indent=2)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
