"""Synchronous vs asynchronous GRPO on CPU: trainer idle fraction and wall time for the same updates.

    .venv/bin/python bench/train_async.py [--rounds 4] [--model tiny:128x4] [--sft-epochs 10] ...
    .venv/bin/python bench/train_async.py --preset demo [--seeds 0,1,2] [--modes sync,async,async-served]

One SFT checkpoint (operator logs of the demo's chores, `demos.chores`) is the start of
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

`--preset demo`: the paired, real-reward comparison on the learning demo (`envforge train demo`).
Per `--seeds` seed: the demo's chore family and operator logs for that seed
(`demos.learning.demo_seed`), SFT once with the demo's `TrainingConfig` (`DEMO_TRAINING`), a
snapshot of the SFT weights; the held-out pass@1 after SFT (greedy, and sampled at the demo's
temperature with its `eval_samples` and sampling seed), once; then per mode the SFT weights
restored (their sha256 recorded per mode: every mode starts bit-identical), the demo's GRPO
schedule (rounds, tasks per round, group size, lr, temperature), and the same held-out pass@1
after GRPO. The summary pairs each mode with sync seed by seed (held-out sampled after GRPO,
async minus sync) and gives the idle and wall ratios against sync (median over seeds).
`--quick` takes `LearningDemoConfig.quick()` (the demo test's short form). The update's cost
is the demo's (one optimizer step per round) unless `--demo-rl-epochs-per-batch` (with
`--demo-rl-lr`) sets it, for every mode alike; `--demo-eval-samples` takes more held-out samples
per task than the demo's 4 (32 draws per seed move pass@1 by 0.031 each).

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
from dataclasses import asdict, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "platform"))

from envforge.config import Settings  # noqa: E402
from envforge.demos.chores import chore_family, operator_logs  # noqa: E402
from envforge.demos.learning import (LearningDemoConfig, demo_seed, held_out_greedy, held_out_sampled,  # noqa: E402
                                     mixed_group_fractions, seed_demonstrations, seed_spread)
from envforge.stages.base import StageContext  # noqa: E402
from envforge.stages.images import ensure_images  # noqa: E402
from envforge.train.config import TrainingConfig  # noqa: E402
from envforge.train.checkpoint import weights_digest, weights_snapshot  # noqa: E402
from envforge.train.loop import (GRPORounds, GRPORun, demonstrations, grpo_rounds, load_model,  # noqa: E402
                                 thread_budgets)
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


MODES = ("sync", "async", "async-served", "sync-reseed")
# sync-reseed: synchronous again, from the same start, with other rollout seeds (and so another task sample per
# round): its difference to sync is the run-to-run spread a schedule's difference has to stand out from.
RESEED = 1_000


def mode_training(training: TrainingConfig, mode: str, a: argparse.Namespace) -> TrainingConfig:
    """The run's TrainingConfig for one schedule: sync (max_staleness 0; sync-reseed with other rollout seeds),
    or asynchronous in-process / served."""
    served = mode == "async-served"
    synchronous = mode in ("sync", "sync-reseed")
    return replace(training, max_staleness=0 if synchronous else a.max_staleness,
                   seed=training.seed + RESEED if mode == "sync-reseed" else training.seed,
                   rollout_policy="served" if served else "in-process",
                   policy_threads=a.policy_threads if served else 0,
                   trainer_threads=a.trainer_threads if served else 0)


def mode_record(run: GRPORun, cfg: GRPORounds, settings: Settings) -> dict:
    """What one mode's GRPO run did: timing, thread budgets, rewards per round, staleness, profile, timeline."""
    rewards = [m["rollout_mean_reward"] for m in run.history]
    update_s = [m.get("step_time_s", 0.0) for m in run.history]
    threads = thread_budgets(cfg)  # what a served policy's loop splits the cores into; others as given
    return {**run.timing(), "max_staleness": cfg.max_staleness, "rollout_policy": cfg.rollout_policy,
            "policy_threads": threads.policy_threads, "trainer_threads": threads.trainer_threads,
            "rollout_mean_reward": rewards, "final_reward": statistics.fmean(rewards[-2:]),
            "median_update_s": statistics.median(update_s),
            "policy_lag_mean": [m.get("policy_lag_mean", 0.0) for m in run.history],
            "profile": profile(run, settings), "timeline": run.timeline}


def schedule_preset(a: argparse.Namespace, settings: Settings, modes: list[str]) -> dict:
    """The schedule on a bench-sized setup (one seed, one SFT, `--epochs-per-batch` sets the update cost)."""
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
    for mode in modes:
        cfg = GRPORounds.from_training(mode_training(training, mode, a), tok.pad_token_id or 0)
        cfg = replace(cfg, grpo=replace(cfg.grpo, epochs_per_batch=a.epochs_per_batch,
                                        equal_reward_groups="keep" if a.keep_equal_groups else "skip"))
        run = grpo_rounds(settings, copy.deepcopy(model), tok, items, cfg, f"bench-{mode}-{int(time.time())}")
        runs[mode] = mode_record(run, cfg, settings)
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
    return {"config": {**vars(a), "sft_s": round(sft_s, 1), "sft_turns": len(sft_samples)}, "runs": runs,
            "ratios": ratios}


def demo_seed_runs(a: argparse.Namespace, settings: Settings, config: LearningDemoConfig, seed: int,
                   modes: list[str]) -> dict:
    """One seed of the paired comparison: the demo's SFT once, then every mode from the same SFT weights."""
    training = replace(config.training, seed=seed)
    data = demo_seed(settings, config, seed)
    model, tok = load_model(training.base_model, seed)
    pad = tok.pad_token_id or 0
    tag = f"bench-demo-s{seed}-{int(time.time())}"
    t0 = time.perf_counter()
    sft_train, sft_eval = seed_demonstrations(settings, data, tok, tag, training.concurrency)
    sft = train_sft(model, sft_train, sft_eval, training.sft_config(pad), tokenizer=tok)
    sft_s = time.perf_counter() - t0
    sft_weights, sft_sha256 = weights_snapshot(model), weights_digest(model)
    _say(f"seed {seed}: SFT {sft_s:.0f} s on {len(sft_train)} turns; held-out evaluation after SFT")
    after_sft = {"pass_at_1": held_out_greedy(settings, model, tok, data, training, tag, "after-sft")}
    after_sft["pass_at_1_sampled"], after_sft["sampled_outcomes"] = held_out_sampled(
        settings, model, tok, data, config, training, tag, "after-sft")
    runs = {}
    for mode in modes:
        model.load_state_dict(sft_weights)  # the previous mode trained these weights in place
        model.eval()  # as after SFT
        start_sha256 = weights_digest(model)
        if start_sha256 != sft_sha256:
            raise RuntimeError(f"seed {seed}, {mode}: the restored weights are not the SFT weights "
                               f"({start_sha256[:12]} != {sft_sha256[:12]}): the comparison would not be paired")
        cfg = GRPORounds.from_training(mode_training(training, mode, a), pad)
        _say(f"seed {seed}: {mode}, {cfg.rounds} GRPO rounds x {cfg.tasks_per_round} tasks x {cfg.group_size}")
        run = grpo_rounds(settings, model, tok, data.train_items, cfg, f"{tag}-{mode}")
        label = f"after-grpo-{mode}"
        greedy = held_out_greedy(settings, model, tok, data, training, tag, label)
        sampled, outcomes = held_out_sampled(settings, model, tok, data, config, training, tag, label)
        runs[mode] = {"start_weights_sha256": start_sha256, "end_weights_sha256": weights_digest(model),
                      **mode_record(run, cfg, settings),
                      "mixed_group_fraction": mixed_group_fractions(run.history),
                      "held_out_pass_at_1_after_grpo": greedy, "held_out_sampled_pass_at_1_after_grpo": sampled,
                      "sampled_gain_over_sft": sampled - after_sft["pass_at_1_sampled"],
                      "greedy_gain_over_sft": greedy - after_sft["pass_at_1"],
                      "sampled_outcomes_after_grpo": outcomes}
        _say(f"seed {seed}: {mode}: idle {run.trainer_idle_fraction:.3f}, wall {run.wall_s:.0f} s, held-out "
             f"sampled {after_sft['pass_at_1_sampled']:.3f} -> {sampled:.3f}")
    return {"seed": seed, "train_tasks": len(data.train_tasks), "held_out_tasks": len(data.held_out),
            "operator_logs": len(data.log_items), "operator_slips": data.slips, "sft_turns": len(sft_train),
            "sft_s": round(sft_s, 1), "sft_final_loss": sft.losses[-1] if sft.losses else None,
            "sft_weights_sha256": sft_sha256, "held_out_after_sft": after_sft, "runs": runs}


def demo_summary(per_seed: list[dict], modes: list[str]) -> dict:
    """Per mode, medians and means over seeds; per asynchronous mode, the differences paired with sync."""
    keys = ("trainer_idle_fraction", "wall_s", "trainer_busy_s", "held_out_sampled_pass_at_1_after_grpo",
            "held_out_pass_at_1_after_grpo", "sampled_gain_over_sft", "final_reward")
    per_mode = {mode: {k: {"median": statistics.median(v), "mean": statistics.fmean(v)}
                       for k in keys for v in [[s["runs"][mode][k] for s in per_seed]]} for mode in modes}
    paired = {}
    for mode in modes:
        if mode == "sync":
            continue
        runs = [(s["runs"][mode], s["runs"]["sync"]) for s in per_seed]
        diff = {k: [y[k] - x[k] for y, x in runs] for k in ("held_out_sampled_pass_at_1_after_grpo",
                                                            "held_out_pass_at_1_after_grpo")}
        ratio = {"idle_fraction_over_sync": [y["trainer_idle_fraction"] / x["trainer_idle_fraction"]
                                             for y, x in runs if x["trainer_idle_fraction"]],
                 "wall_over_sync": [y["wall_s"] / x["wall_s"] for y, x in runs]}
        paired[mode] = {
            **{f"{k}_minus_sync": {"per_seed": v, **seed_spread(v)} for k, v in diff.items()},
            **{k: {"per_seed": [round(x, 4) for x in v], "median": round(statistics.median(v), 4) if v else None}
               for k, v in ratio.items()}}
    after_sft = [s["held_out_after_sft"]["pass_at_1_sampled"] for s in per_seed]
    return {"held_out_sampled_pass_at_1_after_sft": {"per_seed": after_sft, **seed_spread(after_sft)},
            "per_mode": per_mode, "paired_vs_sync": paired}


def demo_preset(a: argparse.Namespace, settings: Settings, modes: list[str]) -> dict:
    """The paired comparison on the learning demo, seed by seed (see the module docstring)."""
    config = LearningDemoConfig.quick() if a.quick else LearningDemoConfig()
    seeds = [int(x) for x in a.seeds.split(",") if x.strip()]
    update = {k: v for k, v in (("rl_epochs_per_batch", a.demo_rl_epochs_per_batch), ("rl_lr", a.demo_rl_lr))
              if v is not None}
    config = replace(config, seeds=tuple(seeds), training=replace(config.training, **update))
    if a.demo_eval_samples is not None:
        config = replace(config, eval_samples=a.demo_eval_samples)
    per_seed = [demo_seed_runs(a, settings, config, seed, modes) for seed in seeds]
    return {"preset": "demo", "config": {"args": vars(a), "learning_demo": asdict(config)},
            "summary": demo_summary(per_seed, modes), "per_seed": per_seed}


def _say(line: str) -> None:
    """Progress on stderr (stdout is the JSON document)."""
    sys.stderr.write(f"[train_async {time.strftime('%H:%M:%S')}] {line}\n")
    sys.stderr.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=("schedule", "demo"), default="schedule",
                    help="schedule: the bench-sized setup below; demo: the learning demo's tasks, SFT and GRPO "
                         "schedule, every mode from the same SFT weights, held-out pass@1 after GRPO")
    ap.add_argument("--seeds", default="0,1,2", help="demo preset: the demo seeds, one SFT each")
    ap.add_argument("--quick", action="store_true", help="demo preset: LearningDemoConfig.quick() (for tests)")
    ap.add_argument("--demo-rl-epochs-per-batch", type=int, default=None,
                    help="demo preset: GRPO optimizer steps per round instead of the demo's (the update's cost; "
                         "every mode gets the same)")
    ap.add_argument("--demo-eval-samples", type=int, default=None,
                    help="demo preset: held-out samples per task for the sampled pass@1 instead of the demo's "
                         "(more: a less noisy comparison of the modes)")
    ap.add_argument("--demo-rl-lr", type=float, default=None, help="demo preset: GRPO learning rate instead of the "
                                                                    "demo's (with --demo-rl-epochs-per-batch)")
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
    ap.add_argument("--modes", default=",".join(MODES[:3]), help="comma-separated: sync, async, async-served, "
                                                                          "sync-reseed (the null: sync with other "
                                                                          "rollout seeds; not run by default)")
    ap.add_argument("--policy-threads", type=int, default=0,
                    help="torch threads of the served policy (async-served; 0 with --trainer-threads 0: the loop's "
                         "split, half the cores each)")
    ap.add_argument("--trainer-threads", type=int, default=0, help="torch threads of the trainer in async-served")
    ap.add_argument("--out", default=None, help="also write the JSON document here")
    ap.add_argument("--data-dir", default=None)
    a = ap.parse_args()
    demo_only = [f"--demo-{k}" for k in ("rl_epochs_per_batch", "rl_lr", "eval_samples")
                 if getattr(a, f"demo_{k}") is not None]
    if a.preset != "demo" and demo_only:
        ap.error(f"{', '.join(o.replace('_', '-') for o in demo_only)}: only for --preset demo "
                 f"(the schedule preset's update: --epochs-per-batch, --rl-lr)")
    if a.preset == "demo":
        given = [f"--{k.replace('_', '-')}" for k in ("model", "rounds", "tasks", "group_size", "sft_epochs",
                                                      "sft_lr", "rl_lr", "epochs_per_batch", "keep_equal_groups",
                                                      "seed")
                 if getattr(a, k) != ap.get_default(k)]
        if given:
            ap.error(f"--preset demo trains as the learning demo does (DEMO_TRAINING); it does not take "
                     f"{', '.join(given)} (use --seeds for the seeds, --demo-rl-epochs-per-batch and --demo-rl-lr for the update)")
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown or "sync" not in modes:
        ap.error(f"--modes {a.modes!r}: give sync (the baseline) and any of async, async-served, sync-reseed; unknown {unknown}")
    load_before = os.getloadavg()
    started = time.perf_counter()
    data_dir = Path(a.data_dir or tempfile.mkdtemp(prefix="envforge-bench-async-"))
    settings = Settings.from_env().with_data_dir(data_dir)
    settings.ensure_dirs()
    body = demo_preset(a, settings, modes) if a.preset == "demo" else schedule_preset(a, settings, modes)
    doc = {
        "bench": "train_async", "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
        "seconds": round(time.perf_counter() - started, 1), **body,
    }
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=2) + "\n")
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
