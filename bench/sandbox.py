"""Benchmark the sandbox runtime against the naive ways, in one run on one machine.

    .venv/bin/python bench/sandbox.py [--quick] [--out FILE]

Prints one JSON document (medians and p90s in ms, ratios against the naive alternative
measured in the same run):
- per-command overhead of a no-op command (`true`) through the in-sandbox agent vs
  `docker exec` (the SDK's exec_run) on the same container; the agent figure is measured
  with a 5 ms pause between commands (the shell for the next command is started while the
  policy thinks), and also back to back;
- a cold start, the naive way: `docker run --rm` of the task image per step;
- warm acquire + reset through the pool (the sandbox is dirtied between cycles);
- throughput: 32 concurrent sandboxes x 200 short commands each, with the error count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "platform"))

from envforge.config import Settings  # noqa: E402
from envforge.sandbox.container import Sandbox  # noqa: E402
from envforge.sandbox.engine import docker_client  # noqa: E402
from envforge.sandbox.images import build_base_image, build_task_image  # noqa: E402
from envforge.sandbox.pool import SandboxPool  # noqa: E402
from envforge.sources.specs import load_spec_file  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1000, 3)


def summary(xs: list[float]) -> dict:
    return {"p50_ms": pct(xs, 0.5), "p90_ms": pct(xs, 0.9), "n": len(xs)}


def timed(fn, n: int, pause_s: float = 0.0) -> list[float]:
    out = []
    for _ in range(n):
        if pause_s:
            time.sleep(pause_s)
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def per_command(client, image: str, n: int) -> dict:
    with Sandbox.start(client, image) as sb:
        timed(lambda: sb.exec("true"), 20)  # warm-up
        agent = timed(lambda: sb.exec("true"), n, pause_s=0.005)
        agent_b2b = timed(lambda: sb.exec("true"), n)
        docker_exec = timed(lambda: sb.container.exec_run(["true"], user="1000:1000"), max(30, n // 5), pause_s=0.005)
    return {"agent": summary(agent), "agent_back_to_back": summary(agent_b2b), "docker_exec": summary(docker_exec)}


def cold_start(client, image: str, n: int) -> dict:
    def run_once():
        client.containers.run(image, ["true"], remove=True, network_mode="none", user="1000:1000")

    return summary(timed(run_once, n))


def warm_acquire_reset(client, image: str, n: int) -> tuple[dict, dict]:
    with SandboxPool(client, max_idle_per_key=2) as pool:
        pool.preheat(image, count=1)
        cycles = []
        for i in range(n):
            t = time.perf_counter()
            sb = pool.acquire(image)
            t_acq = time.perf_counter() - t
            sb.exec(f"echo {i} > junk.txt && rm -rf tests && (sleep 30 &)")  # dirty it (not timed)
            t = time.perf_counter()
            pool.release(sb)
            cycles.append(t_acq + time.perf_counter() - t)
        return summary(cycles), pool.stats.as_dict()


async def concurrent(client, image: str, sandboxes: int, commands: int) -> dict:
    errors: list[str] = []
    with SandboxPool(client, max_idle_per_key=sandboxes, max_starting=4) as pool:
        t0 = time.perf_counter()
        await pool.apreheat(image, count=sandboxes)
        start_s = time.perf_counter() - t0
        boxes = [await pool.aacquire(image) for _ in range(sandboxes)]

        async def drive(k: int, sb: Sandbox) -> None:
            for i in range(commands):
                try:
                    res = await sb.aexec(f"echo {k}-{i}")
                    if res.exit_code != 0 or res.stdout != f"{k}-{i}\n".encode():
                        errors.append(f"sandbox {k} command {i}: exit {res.exit_code} {res.stdout[:50]!r}")
                except Exception as exc:  # noqa: BLE001 - every failure is counted, none stops the run
                    errors.append(f"sandbox {k} command {i}: {type(exc).__name__}: {exc}")

        t1 = time.perf_counter()
        await asyncio.gather(*(drive(k, sb) for k, sb in enumerate(boxes)))
        wall = time.perf_counter() - t1
        for sb in boxes:
            await pool.arelease(sb)
    total = sandboxes * commands
    return {"sandboxes": sandboxes, "commands_each": commands, "commands": total, "errors": len(errors),
            "error_examples": errors[:5], "wall_s": round(wall, 2), "commands_per_s": round(total / wall, 1),
            "preheat_s": round(start_s, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (for a smoke run)")
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    args = ap.parse_args()
    reps = 0.25 if args.quick else 1.0

    settings = Settings.from_env()
    client = docker_client(settings)
    base = build_base_image(client, settings).tag
    task = load_spec_file(REPO / "task_sources" / "specs" / "inventory-median-even" / "task.yaml")
    image = build_task_image(client, task, base, settings).tag
    log(f"image {image}")

    log("per-command overhead")
    cmd = per_command(client, image, int(300 * reps))
    log("cold start (docker run --rm per step)")
    cold = cold_start(client, image, max(5, int(20 * reps)))
    log("warm acquire + reset")
    warm, pool_stats = warm_acquire_reset(client, image, max(10, int(60 * reps)))
    n_box, n_cmd = (8, 50) if args.quick else (32, 200)
    log(f"throughput: {n_box} sandboxes x {n_cmd} commands")
    conc = asyncio.run(concurrent(client, image, n_box, n_cmd))

    result = {
        "machine": {"cpus": __import__("os").cpu_count()},
        "agent_p50_ms": cmd["agent"]["p50_ms"], "agent_p90_ms": cmd["agent"]["p90_ms"],
        "agent_back_to_back_p50_ms": cmd["agent_back_to_back"]["p50_ms"],
        "agent_back_to_back_p90_ms": cmd["agent_back_to_back"]["p90_ms"],
        "docker_exec_p50_ms": cmd["docker_exec"]["p50_ms"], "docker_exec_p90_ms": cmd["docker_exec"]["p90_ms"],
        "agent_speedup_vs_docker_exec": round(cmd["docker_exec"]["p50_ms"] / cmd["agent"]["p50_ms"], 1),
        "agent_back_to_back_speedup_vs_docker_exec":
            round(cmd["docker_exec"]["p50_ms"] / cmd["agent_back_to_back"]["p50_ms"], 1),
        "cold_start_p50_ms": cold["p50_ms"], "cold_start_p90_ms": cold["p90_ms"],
        "warm_acquire_reset_p50_ms": warm["p50_ms"], "warm_acquire_reset_p90_ms": warm["p90_ms"],
        "warm_speedup_vs_cold_start": round(cold["p50_ms"] / warm["p50_ms"], 1),
        "concurrent_sandboxes": conc["sandboxes"], "concurrent_commands": conc["commands"],
        "concurrent_errors": conc["errors"], "concurrent_wall_s": conc["wall_s"],
        "concurrent_commands_per_s": conc["commands_per_s"],
        "details": {"per_command": cmd, "cold_start": cold, "warm_acquire_reset": warm, "pool": pool_stats,
                    "concurrent": conc},
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
