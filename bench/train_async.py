"""Synchronous vs asynchronous GRPO on CPU: trainer idle fraction and wall time for the same updates.

    .venv/bin/python bench/train_async.py [--rounds 4] [--model tiny:128x4] [--sft-epochs 10] ...

One SFT checkpoint (operator logs of the demo's chores, `train.demo_tasks`) is the start of
both runs; then `--rounds` GRPO updates, each on one round of `--tasks` training chores x
`--group-size` samples graded by the real sandbox verifier:
- sync (the naive loop, max_staleness 0): roll out with the current weights, then update;
  the trainer waits for every round;
- async (max_staleness 1): the next round is rolled out while the trainer updates on the
  previous one, by a policy reloaded from each update's checkpoint (saved and reloaded in the
  background): `async` samples from a copy of the weights in the trainer's process,
  `async-served` from an `envforge policy serve` process with its own torch threads
  (`--policy-threads`, the trainer then gets `--trainer-threads`).
The trainer's idle fraction is the share of the run's wall time (start to the end of the last
update) it was not working: 1 - time in updates (+ the weight snapshot in async) / wall;
`trainer_wait_s`, measured apart, is the time it sat waiting for a round. Each run also
reports its profile: per round the rollout seconds, the time the producer was held at the
staleness gate, the update seconds, and where rollout time went (policy sampling vs the
sandbox). All runs use the same seeds, so they sample the same tasks per round. Prints one
JSON document (also written to `--out`) with every run, the ratios against sync, the final
rounds' rollout rewards, and the machine's load average before and after (the machine may
be shared: read the figures with it).

Regimes: when a round's rollouts take far longer than an update, the trainer idles most of
the time under any schedule (overlap hides at most the update); `--epochs-per-batch` sets
the update's cost so that both regimes can be measured.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "platform"))

from envforge.config import Settings  # noqa: E402
from envforge.stages.base import StageContext  # noqa: E402
from envforge.stages.images import ensure_images  # noqa: E402
from envforge.train.config import TrainingConfig  # noqa: E402
from envforge.train.demo_tasks import chore_family, operator_logs  # noqa: E402
from envforge.train.loop import demonstrations, grpo_rounds, load_model, thread_budgets  # noqa: E402
from envforge.train.sft import train_sft  # noqa: E402


def profile(run, settings: Settings) -> dict:
    """Per round, from the run's timeline and its stored trajectories: rollout seconds, the time
    the producer was held at the staleness gate before the round, the update's seconds, and the
    rollout's policy (sampling) and sandbox seconds summed over its trajectories."""
    from envforge.rollout.store import TrajectoryStore

    ev = run.timeline
    at = {(e["event"], e.get("round", e.get("update"))): e["t"] for e in ev if e["side"] in ("producer", "trainer")}
    rounds = []
    for r, batch_id in enumerate(run.batch_ids):
        trajs = TrajectoryStore(settings.artifact_root("rollouts"), batch_id).trajectories()
        policy_s = sum(t.timings.get("policy_s", 0.0) for t in trajs)
        env_s = sum(t.timings.get(k, 0.0) for t in trajs for k in ("reset_s", "env_s", "verify_s", "close_s"))
        gate_s = at[("round_start", r)] - at[("round_end", r - 1)] if r else at[("round_start", 0)]
        rounds.append({"round": r, "rollout_s": round(at[("round_end", r)] - at[("round_start", r)], 3),
                       "producer_gate_s": round(gate_s, 3),
                       "update_s": round(at[("update_end", r)] - at[("update_start", r)], 3),
                       "trajectory_policy_s": round(policy_s, 3), "trajectory_sandbox_s": round(env_s, 3)})
    med = lambda k: round(statistics.median(x[k] for x in rounds), 3) if rounds else 0.0  # noqa: E731
    first_wait = at.get(("update_start", 0), 0.0)  # nothing can overlap the first round
    # which side is the bottleneck: a work-conserving schedule never holds the slower side
    return {"rounds": rounds, "median_rollout_s": med("rollout_s"), "median_update_s": med("update_s"),
            "update_over_rollout": round(med("update_s") / med("rollout_s"), 3) if med("rollout_s") else None,
            "trainer_wait_first_round_s": round(first_wait, 3),
            "trainer_wait_after_first_round_s": round(run.trainer_wait_s - first_wait, 3),
            "producer_gate_after_first_round_s": round(sum(x["producer_gate_s"] for x in rounds[1:]), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny:128x4")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tasks", type=int, default=8, help="training chores per round")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--sft-epochs", type=int, default=40)
    ap.add_argument("--sft-lr", type=float, default=3e-3)
    ap.add_argument("--max-staleness", type=int, default=1)
    ap.add_argument("--rl-lr", type=float, default=2e-3)
    ap.add_argument("--epochs-per-batch", type=int, default=1, help="optimizer steps per round (update cost)")
    ap.add_argument("--keep-equal-groups", action="store_true",
                    help="train on equal-reward groups too (an untrained start solves nothing, so without this "
                         "every group is skipped and no update costs anything: the schedule would not be measured)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--modes", default="sync,async,async-served", help="comma-separated: sync, async, async-served")
    ap.add_argument("--policy-threads", type=int, default=0,
                    help="torch threads of the served policy (async-served; 0 with --trainer-threads 0: the loop's "
                         "split, half the cores each)")
    ap.add_argument("--trainer-threads", type=int, default=0, help="torch threads of the trainer in async-served")
    ap.add_argument("--out", default=None, help="also write the JSON document here")
    ap.add_argument("--data-dir", default=None)
    a = ap.parse_args()
    load_before = os.getloadavg()
    data_dir = Path(a.data_dir or tempfile.mkdtemp(prefix="envforge-bench-async-"))
    settings = Settings.from_env().with_data_dir(data_dir)
    settings.ensure_dirs()
    training = TrainingConfig(base_model=a.model, seed=a.seed, sft_epochs=a.sft_epochs, sft_lr=a.sft_lr,
                              rl_rounds=a.rounds, tasks_per_round=a.tasks, group_size=a.group_size, rl_lr=a.rl_lr,
                              max_tokens=48)
    train, _ = chore_family(a.seed, train_per_chore=4, held_out_per_chore=0)
    items = ensure_images(settings, train, context=StageContext()).items(train)
    image_of = {t.id: image for t, image in items}
    logs = [(log, image_of[log.id.rsplit(".log", 1)[0]])
            for log in operator_logs([t for t, _ in items], a.seed, per_task=1)]
    model, tok = load_model(a.model, a.seed)
    t0 = time.perf_counter()
    sft_samples = []
    if a.sft_epochs > 0:  # 0: start from the untrained model (measures the schedule, not the learning)
        sft_samples = demonstrations(settings, logs, tok, "bench-async-logs", training.concurrency,
                                     only_resolved=False)
        train_sft(model, sft_samples, [], training.sft_config(tok.pad_token_id or 0), tokenizer=tok)
    sft_s = time.perf_counter() - t0
    runs = {}
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - {"sync", "async", "async-served"})
    if unknown or "sync" not in modes:
        ap.error(f"--modes {a.modes!r}: give sync (the baseline) and any of async, async-served; unknown {unknown}")
    for mode in modes:
        served = mode == "async-served"
        mode_training = replace(training, max_staleness=0 if mode == "sync" else a.max_staleness,
                                rollout_policy="served" if served else "in-process",
                                policy_threads=a.policy_threads if served else 0,
                                trainer_threads=a.trainer_threads if served else 0)
        cfg = mode_training.grpo_rounds(tok.pad_token_id or 0)
        cfg = replace(cfg, grpo=replace(cfg.grpo, epochs_per_batch=a.epochs_per_batch,
                                        equal_reward_groups="keep" if a.keep_equal_groups else "skip"))
        run = grpo_rounds(settings, copy.deepcopy(model), tok, items, cfg, f"bench-{mode}-{int(time.time())}")
        rewards = [m["rollout_mean_reward"] for m in run.history]
        update_s = [m.get("step_time_s", 0.0) for m in run.history]
        served_threads = thread_budgets(cfg) if served else cfg
        runs[mode] = {**run.timing(), "max_staleness": cfg.max_staleness, "rollout_policy": cfg.rollout_policy,
                      "policy_threads": served_threads.policy_threads,
                      "trainer_threads": served_threads.trainer_threads,
                      "rollout_mean_reward": rewards, "final_reward": statistics.fmean(rewards[-2:]),
                      "median_update_s": statistics.median(update_s),
                      "policy_lag_mean": [m.get("policy_lag_mean", 0.0) for m in run.history],
                      "profile": profile(run, settings), "timeline": run.timeline}
    s = runs["sync"]
    ratios = {}
    for mode, y in runs.items():
        if mode == "sync":
            continue
        ratios[mode] = {
            "idle_fraction_over_sync": round(y["trainer_idle_fraction"] / s["trainer_idle_fraction"], 4)
            if s["trainer_idle_fraction"] else None,
            "wall_over_sync": round(y["wall_s"] / s["wall_s"], 4),
            "final_reward_minus_sync": round(y["final_reward"] - s["final_reward"], 4)}
    doc = {
        "bench": "train_async", "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
        "config": {**vars(a), "sft_s": round(sft_s, 1), "sft_turns": len(sft_samples)}, "runs": runs,
        "ratios": ratios,
    }
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=2) + "\n")
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
