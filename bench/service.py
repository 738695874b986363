"""Benchmark the environment service on loopback against the in-process environment it wraps.

    .venv/bin/python bench/service.py [--steps N] [--concurrency C] [--sessions S] [--time-limit T]

Starts `envforge service serve` on a free loopback port over a private data directory (one
catalog task set: the bundled `ops-service-config` and `inventory-median-even` specs) and prints
one JSON document:
- `step_latency`: the same `run true` step, N times, through the HTTP client (sync, keep-alive)
  and directly on `RolloutEnv.step` in this process (same engine, same image), alternately (so both
  see the same machine load): p50/p90/p99 of each, the added latency of the HTTP path (p50 and p99
  differences), and the distribution of the paired differences;
- `throughput`: C concurrent workers (asyncio; the async client vs `RolloutEnv` in-process on one
  warm pool) doing S sessions in all, each: open a session on a task, 2 `run` steps, close
  (`episode`); and the same with a graded `submit` (`graded`). Sessions per second and the
  HTTP/in-process ratio. Bounded: at most S sessions per mode and T seconds per mode.
- `replicas`: the same `episode` load (C workers, S sessions a round) against the service as one
  replica and as two replicas, each behind nginx (`envforge.service.replicas.ReplicaSet`, what
  `serve --replicas N` runs; both sets up at once, the warm pool split between a set's replicas),
  rounds alternating between them (`--rounds R` each): each round's sessions/s, their medians and
  the ratio two/one. `--replicas-only` runs just this part.
All traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "platform"))

import httpx  # noqa: E402

from envforge.catalog import Catalog  # noqa: E402
from envforge.config import Settings  # noqa: E402
from envforge.rollout.actions import Run, Submit  # noqa: E402
from envforge.rollout.env import RolloutEnv  # noqa: E402
from envforge.sandbox.engine import docker_client  # noqa: E402
from envforge.sandbox.images import build_base_image, build_task_image  # noqa: E402
from envforge.sandbox.pool import SandboxPool  # noqa: E402
from envforge.service.client import AsyncEnvforgeClient, EnvforgeClient  # noqa: E402
from envforge.service.config import ServiceConfig, TenantLimits  # noqa: E402
from envforge.service.replicas import ReplicaSet  # noqa: E402
from envforge.service.tenants import TenantStore, tenants_path  # noqa: E402
from envforge.sources.result import LoadResult  # noqa: E402
from envforge.sources.specs import load_spec_file  # noqa: E402
from envforge.verify.grader import Grader  # noqa: E402

TASKS = ("ops-service-config", "inventory-median-even")


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(1000 * xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))], 3)


def summary(xs: list[float]) -> dict:
    return {"n": len(xs), "p50_ms": pct(xs, 0.5), "p90_ms": pct(xs, 0.9), "p99_ms": pct(xs, 0.99),
            "mean_ms": round(1000 * statistics.fmean(xs), 3)}


def prepare(data_dir: Path, client) -> tuple[Settings, dict, str]:
    settings = Settings.from_env().with_data_dir(data_dir)
    settings.ensure_dirs()
    tasks = [load_spec_file(REPO / "task_sources" / "specs" / name / "task.yaml") for name in TASKS]
    base = build_base_image(client, settings).tag
    cat = Catalog(settings.catalog_path)
    cat.ingest(LoadResult(tasks=tasks))
    builds = [(t, build_task_image(client, t, base, settings)) for t in tasks]
    cat.record_images(builds)
    cat.create_task_set("bench", tasks)
    store = TenantStore(tenants_path(settings))
    store.upsert_tenant("bench", ["bench"], TenantLimits(max_sessions=1024, steps_per_minute=10**7,
                                                         sandbox_seconds_per_day=10**9))
    key = store.create_key("bench")[0]
    store.close()
    return settings, {t.id: (t, b.tag) for t, b in builds}, key


def start_server(settings: Settings, concurrency: int) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "ENVFORGE_DATA_DIR": str(settings.data_dir), "ENVFORGE_SERVICE_MLFLOW": "false",
           "ENVFORGE_SERVICE_POOL_IDLE": str(concurrency), "ENVFORGE_SERVICE_MAX_SESSIONS": str(4 * concurrency)}
    proc = subprocess.Popen([sys.executable, "-m", "envforge.cli", "service", "serve", "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the service did not start")


STEPS_PER_SESSION = 12  # below every bundled task's max_turns: sessions are renewed between chunks


async def paired_latency(url: str, key: str, pool: SandboxPool, grader: Grader, task, image: str,
                         steps: int) -> tuple[list[float], list[float]]:
    """The same step through HTTP and in process, alternately: on a shared, noisy machine both paths
    see the same load, and the paired differences isolate what the HTTP path adds."""
    http, inproc = [], []
    loop = asyncio.get_running_loop()
    with EnvforgeClient(url, key) as client:
        while len(http) < steps + 20:
            env = RolloutEnv(pool, grader, task, image)
            await env.reset()
            session = await loop.run_in_executor(None, lambda: client.create_session(task_set="bench", index=1))
            try:
                for _ in range(STEPS_PER_SESSION):
                    t0 = time.perf_counter()
                    await loop.run_in_executor(None, lambda: session.step(name="run", arguments={"command": "true"}))
                    t1 = time.perf_counter()
                    await env.step(Run("true"))
                    t2 = time.perf_counter()
                    http.append(t1 - t0)
                    inproc.append(t2 - t1)
            finally:
                await env.close()
                await loop.run_in_executor(None, session.close)
    return http[20:], inproc[20:]  # the first steps warm connections and caches


async def throughput_http(url: str, key: str, concurrency: int, sessions: int, graded: bool, limit_s: float) -> dict:
    done, errors = 0, []
    deadline = time.monotonic() + limit_s
    queue = list(range(sessions))

    async with AsyncEnvforgeClient(url, key) as client:
        async def worker() -> None:
            nonlocal done
            while queue and time.monotonic() < deadline:
                n = queue.pop()
                try:
                    s = await client.create_session(task_set="bench", index=1)  # ops-service-config, as in-process
                    await s.step(name="run", arguments={"command": "true"})
                    await s.step(name="run", arguments={"command": "echo x > /tmp/x"})
                    if graded:
                        await s.step(name="submit")
                    await s.close()
                    done += 1
                except Exception as exc:  # counted, not fatal: the figure says how many failed
                    errors.append(f"{n}: {type(exc).__name__}: {exc}"[:200])

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return {"sessions": done, "errors": len(errors), "first_errors": errors[:3], "wall_s": round(wall, 2),
            "sessions_per_s": round(done / wall, 3)}


async def throughput_inprocess(pool: SandboxPool, grader: Grader, task, image: str, concurrency: int, sessions: int,
                               graded: bool, limit_s: float) -> dict:
    done = 0
    deadline = time.monotonic() + limit_s
    queue = list(range(sessions))

    async def worker() -> None:
        nonlocal done
        while queue and time.monotonic() < deadline:
            queue.pop()
            env = RolloutEnv(pool, grader, task, image)
            try:
                await env.reset()
                await env.step(Run("true"))
                await env.step(Run("echo x > /tmp/x"))
                if graded:
                    await env.step(Submit())
                    await env.verify()
            finally:
                await env.close()
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    return {"sessions": done, "errors": 0, "wall_s": round(wall, 2), "sessions_per_s": round(done / wall, 3)}


def start_replica_set(settings: Settings, count: int, concurrency: int) -> ReplicaSet:
    """`count` replicas behind nginx on a free port, the warm pool split between them."""
    os.environ.update({"ENVFORGE_SERVICE_MLFLOW": "false", "ENVFORGE_SERVICE_POOL_IDLE": str(-(-concurrency // count)),
                       "ENVFORGE_SERVICE_MAX_SESSIONS": str(4 * concurrency)})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = ServiceConfig.from_env().with_overrides(host="127.0.0.1", port=port)
    return ReplicaSet(config, count, settings.data_dir / "bench-replicas" / str(count), settings.data_dir).start()


def compare_replicas(settings: Settings, key: str, concurrency: int, sessions: int, rounds: int,
                     limit_s: float) -> dict:
    """Sessions/s of one replica vs two, both behind nginx, in alternating rounds (same machine load)."""
    sets = {}
    try:
        for count in (1, 2):
            log(f"starting {count} replica(s) behind nginx")
            sets[count] = start_replica_set(settings, count, concurrency)
        runs: dict[int, list[dict]] = {1: [], 2: []}
        for r in range(rounds):
            for count, replica_set in sets.items():
                log(f"round {r + 1}/{rounds}: {count} replica(s), {concurrency} concurrent, {sessions} sessions")
                runs[count].append(asyncio.run(throughput_http(replica_set.url, key, concurrency, sessions, False,
                                                               limit_s)))
    finally:
        for replica_set in sets.values():
            replica_set.stop()
    medians = {n: round(statistics.median(x["sessions_per_s"] for x in rs), 3) for n, rs in runs.items()}
    return {"mode": "episode", "concurrency": concurrency, "sessions_per_round": sessions, "rounds": rounds,
            **{name: {"sessions_per_s": [x["sessions_per_s"] for x in runs[n]], "median": medians[n],
                      "errors": sum(x["errors"] for x in runs[n]),
                      "first_errors": [e for x in runs[n] for e in x["first_errors"]][:3]}
               for n, name in ((1, "one_replica"), (2, "two_replicas"))},
            "ratio_two_vs_one": round(medians[2] / medians[1], 3) if medians[1] else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--sessions", type=int, default=128)
    parser.add_argument("--time-limit", type=float, default=240.0, help="seconds per throughput mode, at most")
    parser.add_argument("--latency-only", action="store_true", help="skip the throughput and replica parts")
    parser.add_argument("--replicas-only", action="store_true", help="only sessions/s with one vs two replicas")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per replica count")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    client = docker_client(Settings.from_env())
    with tempfile.TemporaryDirectory(prefix="bench-service-") as tmp:
        settings, images, key = prepare(Path(tmp) / "data", client)
        if args.replicas_only:
            doc = {"bench": "service", "task": "ops-service-config", "cpus": os.cpu_count(),
                   "replicas": compare_replicas(settings, key, args.concurrency, args.sessions, args.rounds,
                                                args.time_limit),
                   "load_avg_1m_at_end": round(os.getloadavg()[0], 2)}
            emit(doc, args.out)
            return
        task, image = images["ops-service-config"]
        log("starting the service")
        proc, url = start_server(settings, args.concurrency)
        pool = SandboxPool(client, max_idle_per_key=args.concurrency, max_starting=4)
        grader = Grader(client, pool)
        try:
            log(f"step latency, {args.steps} paired steps")
            http, inproc = asyncio.run(paired_latency(url, key, pool, grader, task, image, args.steps))
            diffs = [h - i for h, i in zip(http, inproc)]
            lat = {"in_process": summary(inproc), "http": summary(http),
                   "added_p50_ms": round(pct(http, 0.5) - pct(inproc, 0.5), 3),
                   "added_p99_ms": round(pct(http, 0.99) - pct(inproc, 0.99), 3),
                   "paired_difference": summary(diffs)}
            throughput = {}
            for graded in (() if args.latency_only else (False, True)):
                mode = "graded" if graded else "episode"
                log(f"throughput ({mode}), {args.concurrency} concurrent, {args.sessions} sessions")
                h = asyncio.run(throughput_http(url, key, args.concurrency, args.sessions, graded, args.time_limit))
                i = asyncio.run(throughput_inprocess(pool, grader, task, image, args.concurrency, args.sessions,
                                                     graded, args.time_limit))
                throughput[mode] = {"http": h, "in_process": i, "ratio_http_vs_in_process": round(
                    h["sessions_per_s"] / i["sessions_per_s"], 3) if i["sessions_per_s"] else None}
        finally:
            pool.close()
            proc.terminate()
            proc.wait(60)
        replicas = None if args.latency_only else compare_replicas(settings, key, args.concurrency, args.sessions,
                                                                   args.rounds, args.time_limit)
    doc = {"bench": "service", "task": "ops-service-config", "cpus": os.cpu_count(),
           "load_avg_1m_at_end": round(os.getloadavg()[0], 2), "step_latency": lat,
           "throughput": {"concurrency": args.concurrency, **throughput}, "replicas": replicas}
    emit(doc, args.out)


def emit(doc: dict, out: Path | None) -> None:
    text = json.dumps(doc, indent=2)
    if out:
        out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
