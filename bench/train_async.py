"""Synchronous vs asynchronous GRPO on CPU: trainer idle fraction and wall time for the same updates.

    .venv/bin/python bench/train_async.py [--rounds 4] [--model tiny:128x4] [--sft-epochs 10] ...

One SFT checkpoint (operator logs of the demo's chores, `train.demo_tasks`) is the start of
both runs; then `--rounds` GRPO updates, each on one round of `--tasks` training chores x
`--group-size` samples graded by the real sandbox verifier:
- sync (the naive loop, max_staleness 0): roll out with the current weights, then update;
  the trainer waits for every round;
- async (max_staleness 1): the next round is rolled out, by a policy copy reloaded from each
  update's checkpoint, while the trainer updates on the previous one.
The trainer's idle fraction is the share of the run's wall time it spent waiting for
rollouts (1 - time in update, checkpoint save and policy reload / wall time). Both runs use
the same seeds, so they sample the same tasks per round. Prints one JSON document with
both runs, the async/sync ratios, the final rounds' rollout rewards, and the machine's
load average before and after (the machine may be shared: read the figures with it).
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
from envforge.train.loop import demonstrations, grpo_rounds, load_model  # noqa: E402
from envforge.train.sft import train_sft  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny:128x4")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tasks", type=int, default=8, help="training chores per round")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--sft-epochs", type=int, default=40)
    ap.add_argument("--sft-lr", type=float, default=3e-3)
    ap.add_argument("--max-staleness", type=int, default=1)
    ap.add_argument("--epochs-per-batch", type=int, default=1, help="optimizer steps per round (update cost)")
    ap.add_argument("--keep-equal-groups", action="store_true",
                    help="train on equal-reward groups too (an untrained start solves nothing, so without this "
                         "every group is skipped and no update costs anything: the schedule would not be measured)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=None)
    a = ap.parse_args()
    load_before = os.getloadavg()
    data_dir = Path(a.data_dir or tempfile.mkdtemp(prefix="envforge-bench-async-"))
    settings = Settings.from_env().with_data_dir(data_dir)
    settings.ensure_dirs()
    training = TrainingConfig(base_model=a.model, seed=a.seed, sft_epochs=a.sft_epochs, sft_lr=a.sft_lr,
                              rl_rounds=a.rounds, tasks_per_round=a.tasks, group_size=a.group_size, rl_lr=2e-3,
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
    for mode, staleness in (("sync", 0), ("async", a.max_staleness)):
        cfg = replace(training, max_staleness=staleness).grpo_rounds(tok.pad_token_id or 0)
        cfg = replace(cfg, grpo=replace(cfg.grpo, epochs_per_batch=a.epochs_per_batch,
                                        equal_reward_groups="keep" if a.keep_equal_groups else "skip"))
        run = grpo_rounds(settings, copy.deepcopy(model), tok, items, cfg, f"bench-{mode}-{int(time.time())}")
        rewards = [m["rollout_mean_reward"] for m in run.history]
        update_s = [m.get("step_time_s", 0.0) for m in run.history]
        runs[mode] = {**run.timing(), "max_staleness": staleness, "rollout_mean_reward": rewards,
                      "final_reward": statistics.fmean(rewards[-2:]), "median_update_s": statistics.median(update_s),
                      "policy_lag_mean": [m.get("policy_lag_mean", 0.0) for m in run.history]}
    s, y = runs["sync"], runs["async"]
    doc = {
        "bench": "train_async", "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
        "config": {**vars(a), "sft_s": round(sft_s, 1), "sft_turns": len(sft_samples)}, "runs": runs,
        "ratios": {"idle_fraction_async_over_sync": round(y["trainer_idle_fraction"] / s["trainer_idle_fraction"], 4)
                   if s["trainer_idle_fraction"] else None,
                   "wall_async_over_sync": round(y["wall_s"] / s["wall_s"], 4),
                   "final_reward_async_minus_sync": round(y["final_reward"] - s["final_reward"], 4)},
    }
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
