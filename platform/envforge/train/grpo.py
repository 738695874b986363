"""GRPO on rollout turns: group-normalized advantages and a clipped, token-level policy loss.

Advantages. Trajectories of the same task form a group; a trajectory's advantage is its
reward minus the group mean, divided by the group std (population std, + eps) when
`scale_advantages`. Every turn of a trajectory gets its trajectory's advantage.
A group whose rewards are all equal (all solved, all failed, or a single trajectory) has
zero advantage everywhere: it contributes no policy gradient, only compute and (under
token-mean) a larger denominator that shrinks everyone else's gradient. With
`equal_reward_groups="skip"` (default) such groups are dropped and counted
(`skipped_groups`); "keep" trains on them anyway (they still feed the KL term).

Loss, per completion token t with ratio r = exp(logp_new - logp_behaviour):
    -min(r * A, clip(r, 1 - clip_eps, 1 + clip_eps_high) * A) + kl_coef * k3
with k3 = exp(ref - new) - (ref - new) - 1 >= 0, the unbiased low-variance KL(new || ref)
estimator (Schulman). The asymmetric upper clip (DAPO's "clip-higher") lets unlikely tokens
with positive advantage grow more before clipping, which keeps entropy from collapsing.
Aggregation `loss_agg`:
- "token-mean" (default, DAPO): the sum over every completion token of the batch divided by
  the batch's total completion-token count. Each token weighs the same, so long
  trajectories are not down-weighted per token and the gradient scale does not depend on
  how samples are split into micro-batches.
- "seq-mean" (original GRPO): the mean over samples of each sample's mean token loss.
Behaviour log-probs must come from the same distribution the loss evaluates, i.e. the
sampler's temperature: `GRPOConfig.temperature` divides the logits the same way.

Hardening, for off-policy (asynchronous) batches:
- The log-ratio is clamped to +-`log_ratio_clamp` before `exp`: a sample several versions
  stale, or a token whose behaviour log-prob came from a slightly different kernel, can put
  the log-ratio far out (exp(89) overflows float32, exp(12) bf16 precision); past the clamp
  the ratio is outside any clip range anyway, so only the overflow is removed.
- Truncated completions (the turn hit `max_tokens` and has no stop token) are masked out of
  the loss by default (`truncated="mask"`, DAPO's overlong filtering): the reward of a
  trajectory says nothing about what the cut-off tokens would have led to, and training them
  with the trajectory's full advantage teaches rambling (positive A) or punishes a possibly
  good prefix (negative A). Masked tokens leave the token-mean denominator too. "keep"
  trains them like any other turn (the original GRPO); "penalize" keeps them and gives
  them advantage min(A, -|overlong_penalty|), a flat push away from running out of budget.
- `off_policy=True` (asynchronous training, max_staleness > 0) refuses samples without
  behaviour log-probs: taking the current weights' log-probs as "old" would silently make a
  stale sample look on-policy (ratio 1), i.e. no importance correction at all.
"""

from __future__ import annotations

import copy
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from envforge.observe import metrics as live
from envforge.train.batching import Batch, micro_batches, per_sample_mean, token_logprobs
from envforge.train.checkpoint import load_trainer_state, load_weights, save_checkpoint
from envforge.train.config import TRAINING_DEFAULTS, TrainingConfig
from envforge.train.samples import TurnSample
from envforge.train.sft import autocast_for, build_optimizer, build_scheduler, model_device

Groups = Mapping[str, Sequence[tuple[float, Sequence[TurnSample]]]]


@dataclass
class GRPOConfig:
    lr: float = TRAINING_DEFAULTS.rl_lr
    clip_eps: float = TRAINING_DEFAULTS.clip_eps  # lower clip: ratio >= 1 - clip_eps
    clip_eps_high: float = TRAINING_DEFAULTS.clip_eps_high  # upper clip: ratio <= 1 + clip_eps_high
    kl_coef: float = (
        TRAINING_DEFAULTS.kl_coef
    )  # weight of the k3 KL to the reference model (needs a ref model when > 0)
    loss_agg: str = TRAINING_DEFAULTS.loss_agg  # "token-mean" | "seq-mean", see the module docstring
    equal_reward_groups: str = "skip"  # "skip" | "keep", see the module docstring
    scale_advantages: bool = True  # divide by the group std + adv_eps
    adv_eps: float = 1e-6
    micro_batch_size: int = 8  # samples per forward (packed rows when `packing`)
    epochs_per_batch: int = (
        TRAINING_DEFAULTS.rl_epochs_per_batch
    )  # optimizer steps per rollout batch (each over all its samples)
    max_grad_norm: float = 1.0
    lr_schedule: str = "constant"  # "cosine" | "linear" | "constant" (after linear warmup)
    warmup_steps: int = 0
    total_steps: int = 1000  # horizon of the cosine/linear decay, in optimizer steps
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    temperature: float = (
        TRAINING_DEFAULTS.temperature
    )  # the sampler's temperature (behaviour log-probs are of logits / T)
    packing: bool = False
    pack_len: int = 8192  # packed row capacity (no truncation: RL never cuts a sample)
    dtype: str = "auto"
    chunk_tokens: int = 1024
    pad_id: int = 0
    fused_adam: bool | None = None
    seed: int = TRAINING_DEFAULTS.seed
    log_ratio_clamp: float = 20.0  # |logp_new - logp_behaviour| is clamped to this before exp
    truncated: str = (
        TRAINING_DEFAULTS.truncated
    )  # "mask" | "penalize" | "keep": completions that hit max_tokens, see the docstring
    overlong_penalty: float = 1.0  # "penalize": truncated turns get advantage min(A, -overlong_penalty)
    off_policy: bool = False  # samples may come from older policy versions: behaviour log-probs required

    @classmethod
    def from_training(cls, config: TrainingConfig, pad_id: int) -> "GRPOConfig":
        """The GRPO update of the pipeline's one training configuration."""
        return cls(
            lr=config.rl_lr,
            seed=config.seed,
            pad_id=pad_id,
            temperature=config.temperature,
            epochs_per_batch=config.rl_epochs_per_batch,
            clip_eps=config.clip_eps,
            clip_eps_high=config.clip_eps_high,
            loss_agg=config.loss_agg,
            kl_coef=config.kl_coef,
            truncated=config.truncated,
            off_policy=config.max_staleness > 0,
        )


@dataclass
class GroupStats:
    groups: int = 0
    skipped_groups: int = 0
    trajectories: int = 0
    samples: int = 0  # samples kept for training
    reward_mean: float = 0.0  # over all trajectories, skipped groups included
    reward_std: float = 0.0
    solved_fraction: float = 0.0  # trajectories with reward > 0

    def to_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


def groups_from_samples(samples: Sequence[TurnSample]) -> dict[str, list[tuple[float, list[TurnSample]]]]:
    """The simpler input: flat samples whose `group_id`, `trajectory_id` and `reward` are set.

    Turns sharing (group_id, trajectory_id) form one trajectory, whose reward is its turns'
    (they carry the same one); a sample without a trajectory id is a one-turn trajectory."""
    groups: dict[str, OrderedDict[str, list[TurnSample]]] = {}
    for n, s in enumerate(samples):
        traj = s.trajectory_id or f"#sample-{n}"
        groups.setdefault(s.group_id, OrderedDict()).setdefault(traj, []).append(s)
    return {g: [(turns[0].reward, turns) for turns in trajs.values()] for g, trajs in groups.items()}


def group_advantages(
    groups: Groups | Sequence[TurnSample], *, scale: bool = True, eps: float = 1e-6, equal_reward_groups: str = "skip"
) -> tuple[list[TurnSample], GroupStats]:
    """Samples (copies) carrying their trajectory's group-normalized advantage, and group stats.

    `groups` maps a group id to its trajectories as (reward, turns); a flat list of samples is
    grouped by `groups_from_samples`. See the module docstring for the normalization and for
    what happens to equal-reward groups."""
    if equal_reward_groups not in ("skip", "keep"):
        raise ValueError("equal_reward_groups must be 'skip' or 'keep'")
    if not isinstance(groups, Mapping):
        groups = groups_from_samples(groups)
    out: list[TurnSample] = []
    all_rewards: list[float] = []
    stats = GroupStats(groups=len(groups))
    for group_id, trajectories in groups.items():
        rewards = torch.tensor([float(r) for r, _ in trajectories], dtype=torch.float64)
        all_rewards.extend(rewards.tolist())
        stats.trajectories += len(trajectories)
        if len(trajectories) == 0:
            continue
        equal = bool((rewards == rewards[0]).all())
        if equal and equal_reward_groups == "skip":
            stats.skipped_groups += 1
            continue
        adv = rewards - rewards.mean()
        if scale:
            adv = adv / (rewards.std(unbiased=False) + eps)
        for (reward, turns), a in zip(trajectories, adv.tolist()):
            for t in turns:
                out.append(replace(t, advantage=float(a), reward=float(reward), group_id=t.group_id or group_id))
    stats.samples = len(out)
    if all_rewards:
        r = torch.tensor(all_rewards, dtype=torch.float64)
        stats.reward_mean = float(r.mean())
        stats.reward_std = float(r.std(unbiased=False))
        stats.solved_fraction = float((r > 0).double().mean())
    return out, stats


def grpo_loss(
    new_logprobs: torch.Tensor,
    batch: Batch,
    config: GRPOConfig,
    *,
    normalizer: float,
    ref_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped-surrogate (+ k3 KL) loss of one micro-batch, already divided by `normalizer`
    (the total completion tokens of the whole batch for token-mean, its sample count for
    seq-mean), and detached sums for metrics (clipped tokens, kl, ratio)."""
    mask = batch.loss_mask
    maskf = mask.float()
    adv = batch.advantages
    log_ratio = torch.clamp(
        (new_logprobs - batch.behaviour_logprobs) * maskf, -config.log_ratio_clamp, config.log_ratio_clamp
    )
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - config.clip_eps, 1.0 + config.clip_eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    kl = torch.zeros_like(new_logprobs)
    if ref_logprobs is not None:
        d = (ref_logprobs - new_logprobs) * maskf
        kl = torch.exp(d) - d - 1.0
        if config.kl_coef:
            per_token = per_token + config.kl_coef * kl
    per_token = per_token * maskf
    if config.loss_agg == "token-mean":
        loss = per_token.sum() / normalizer
    elif config.loss_agg == "seq-mean":
        loss = per_sample_mean(per_token, batch).sum() / normalizer
    else:
        raise ValueError(f"loss_agg must be 'token-mean' or 'seq-mean', not {config.loss_agg!r}")
    with torch.no_grad():
        is_clipped = ((adv > 0) & (ratio > 1.0 + config.clip_eps_high)) | ((adv < 0) & (ratio < 1.0 - config.clip_eps))
        sums = {
            "clipped": (is_clipped & mask).sum().float(),
            "kl": (kl * maskf).sum(),
            "ratio": (ratio * maskf).sum(),
            "tokens": maskf.sum(),
        }
    return loss, sums


def handle_truncated(samples: Sequence[TurnSample], config: GRPOConfig) -> list[TurnSample]:
    """Apply `config.truncated` to completions that hit the token budget (see the module docstring):
    "mask" drops them from the batch, "penalize" caps their advantage at -overlong_penalty."""
    if config.truncated not in ("mask", "penalize", "keep"):
        raise ValueError(f"truncated must be 'mask', 'penalize' or 'keep', not {config.truncated!r}")
    if config.truncated == "mask":
        return [s for s in samples if not s.truncated]
    if config.truncated == "penalize":
        return [
            replace(s, advantage=min(s.advantage, -abs(config.overlong_penalty))) if s.truncated else s for s in samples
        ]
    return list(samples)


def _reward_stats(samples: Sequence[TurnSample]) -> tuple[float, float]:
    per_traj: dict[tuple[str, str], float] = {}
    for n, s in enumerate(samples):
        per_traj[(s.group_id, s.trajectory_id or f"#{n}")] = s.reward
    if not per_traj:
        return 0.0, 0.0
    r = torch.tensor(list(per_traj.values()), dtype=torch.float64)
    return float(r.mean()), float(r.std(unbiased=False))


def grpo_update(
    model: PreTrainedModel,
    ref_model: PreTrainedModel | None,
    optimizer: torch.optim.Optimizer,
    scheduler: Any | None,
    samples: Sequence[TurnSample],
    config: GRPOConfig,
    *,
    group_stats: GroupStats | None = None,
) -> dict[str, float]:
    """`epochs_per_batch` optimizer steps of GRPO on `samples` (advantages already set).

    Each step accumulates gradients over all micro-batches, clips them and steps the optimizer
    and scheduler. Truncated completions are handled per `config.truncated`. Samples without
    behaviour log-probs are taken as on-policy (their "old" log-probs are the model's own
    before the first step), unless `config.off_policy`, where they are refused. The reference model's log-probs
    are computed once (and the KL reported) whenever a ref model is given; they enter the
    loss only with kl_coef > 0. Metrics: loss, kl, entropy, clip_fraction, ratio_mean,
    grad_norm, tokens, tokens_per_s, reward_mean/std, skipped_groups (from `group_stats`).
    An empty batch (every group skipped) takes no step."""
    if config.kl_coef and ref_model is None:
        raise ValueError("kl_coef > 0 needs a reference model")
    t0 = time.perf_counter()
    device = model_device(model)
    r_mean, r_std = (group_stats.reward_mean, group_stats.reward_std) if group_stats else _reward_stats(samples)
    metrics: dict[str, float] = {
        "reward_mean": r_mean,
        "reward_std": r_std,
        "skipped_groups": float(group_stats.skipped_groups if group_stats else 0),
        "samples": float(len(samples)),
        "truncated_samples": float(sum(s.truncated for s in samples)),
    }
    samples = handle_truncated(samples, config)
    have = [s.behaviour_logprobs is not None for s in samples]
    if config.off_policy and not all(have):
        missing = next(s for s in samples if s.behaviour_logprobs is None)
        raise ValueError(
            f"off-policy GRPO needs behaviour log-probs for every sample: trajectory "
            f"{missing.trajectory_id or '?'} (group {missing.group_id or '?'}, policy version "
            f"{missing.policy_version}) has none; the policy that sampled it must return log-probs"
        )
    if any(have) and not all(have):
        raise ValueError("either every sample has behaviour_logprobs or none has (on-policy)")
    if not samples:
        return {
            **metrics,
            "loss": 0.0,
            "kl": 0.0,
            "entropy": 0.0,
            "clip_fraction": 0.0,
            "ratio_mean": 0.0,
            "grad_norm": 0.0,
            "tokens": 0.0,
            "tokens_per_s": 0.0,
            "step_time_s": 0.0,
        }
    batches = [
        b.to(device)
        for b in micro_batches(
            samples, config.micro_batch_size, pack=config.packing, pack_len=config.pack_len, pad_id=config.pad_id
        )
    ]
    total_tokens = sum(b.n_loss_tokens for b in batches)
    normalizer = float(total_tokens if config.loss_agg == "token-mean" else len(samples))
    ref_lps: list[torch.Tensor | None] = [None] * len(batches)
    with torch.no_grad():
        for i, b in enumerate(batches):
            if not all(have):
                with autocast_for(device, config.dtype):
                    old, _ = token_logprobs(
                        model, b, temperature=config.temperature, chunk_tokens=config.chunk_tokens, with_entropy=False
                    )
                b.behaviour_logprobs = old.float()
            if ref_model is not None:
                with autocast_for(device, config.dtype):
                    ref, _ = token_logprobs(
                        ref_model,
                        b,
                        temperature=config.temperature,
                        chunk_tokens=config.chunk_tokens,
                        with_entropy=False,
                    )
                ref_lps[i] = ref.float()
    model.train()
    sums = {"loss": 0.0, "clipped": 0.0, "kl": 0.0, "ratio": 0.0, "tokens": 0.0, "entropy": 0.0}
    grad_norm = 0.0
    real_tokens = 0
    for _epoch in range(config.epochs_per_batch):
        optimizer.zero_grad(set_to_none=True)
        for b, ref in zip(batches, ref_lps):
            with autocast_for(device, config.dtype):
                new, entropy = token_logprobs(
                    model, b, temperature=config.temperature, chunk_tokens=config.chunk_tokens
                )
            loss, s = grpo_loss(new, b, config, normalizer=normalizer, ref_logprobs=ref)
            loss.backward()
            sums["loss"] += float(loss.detach())
            sums["entropy"] += float((entropy.detach() * b.loss_mask).sum())
            for k in ("clipped", "kl", "ratio", "tokens"):
                sums[k] += float(s[k])
            real_tokens += b.n_real_tokens
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm))
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dt = time.perf_counter() - t0
    n = max(1.0, sums["tokens"])
    metrics.update(
        {
            "loss": sums["loss"] / config.epochs_per_batch,
            "kl": sums["kl"] / n,
            "entropy": sums["entropy"] / n,
            "clip_fraction": sums["clipped"] / n,
            "ratio_mean": sums["ratio"] / n,
            "grad_norm": grad_norm,
            "tokens": float(total_tokens),
            "tokens_per_s": real_tokens / dt if dt > 0 else 0.0,
            "step_time_s": dt,
            "lr": float(optimizer.param_groups[0]["lr"]),
        }
    )
    return metrics


class GRPOTrainer:
    """A policy being trained with GRPO: model, optional frozen reference, optimizer, scheduler, step.

    `step(samples)` groups the samples (by group_id / trajectory_id, with their rewards),
    computes advantages and runs `grpo_update`; `save(path)` writes a servable checkpoint
    with trainer state, `resume(path)` loads one back into this trainer."""

    def __init__(
        self,
        model: PreTrainedModel,
        config: GRPOConfig | None = None,
        *,
        ref_model: PreTrainedModel | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        make_ref: bool = False,
    ) -> None:
        self.config = config or GRPOConfig()
        self.model = model
        self.tokenizer = tokenizer
        if ref_model is None and (make_ref or self.config.kl_coef > 0):
            ref_model = copy.deepcopy(model)
        if ref_model is not None:
            ref_model.requires_grad_(False).eval()
        self.ref_model = ref_model
        c = self.config
        self.optimizer = build_optimizer(model, lr=c.lr, weight_decay=c.weight_decay, betas=c.betas, fused=c.fused_adam)
        self.scheduler = build_scheduler(
            self.optimizer, total_steps=c.total_steps, warmup_steps=c.warmup_steps, schedule=c.lr_schedule
        )
        self.step_count = 0
        self.history: list[dict[str, float]] = []

    def step(self, samples: Sequence[TurnSample], *, advantages_ready: bool = False) -> dict[str, float]:
        """One GRPO update on a rollout batch. Unless `advantages_ready`, advantages are computed
        from the samples' rewards and groups first (equal-reward groups handled per config)."""
        stats: GroupStats | None = None
        if not advantages_ready:
            samples, stats = group_advantages(
                samples,
                scale=self.config.scale_advantages,
                eps=self.config.adv_eps,
                equal_reward_groups=self.config.equal_reward_groups,
            )
        metrics = grpo_update(
            self.model, self.ref_model, self.optimizer, self.scheduler, samples, self.config, group_stats=stats
        )
        if samples:
            self.step_count += self.config.epochs_per_batch
        if stats is not None:
            metrics["groups"] = float(stats.groups)
            metrics["solved_fraction"] = stats.solved_fraction
        metrics["step"] = float(self.step_count)
        self.history.append(metrics)
        live.train_step(metrics, "grpo")
        return metrics

    def save(self, path: str | Path, extra: Mapping[str, Any] | None = None) -> Path:
        return save_checkpoint(
            path,
            self.model,
            self.tokenizer,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            step=self.step_count,
            extra={"grpo_config": asdict(self.config), **(extra or {})},
        )

    def resume(self, path: str | Path) -> int:
        """Load weights, optimizer, scheduler, step and RNG states from a checkpoint of this trainer."""
        load_weights(self.model, path)
        self.step_count = load_trainer_state(path, self.optimizer, self.scheduler)
        return self.step_count
