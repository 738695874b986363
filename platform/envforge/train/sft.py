"""Supervised fine-tuning on demonstration turns: causal-LM loss on completion tokens only.

One optimizer step is `grad_accum` micro-batches; the loss of a step is the mean NLL over
every completion token of the step (each micro-batch's summed NLL is divided by the step's
total token count before backward), so accumulation gives exactly the gradient of the big
batch, whatever the micro-batch lengths. Data order comes from a generator seeded by
(seed, epoch), not from the global RNG, so a run resumed from a checkpoint replays the same
batches: with the RNG states restored too, its next step is the uninterrupted run's.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from envforge.observe import metrics as live
from envforge.train.batching import Batch, collate, collate_rows, pack_rows, token_logprobs, truncate
from envforge.train.checkpoint import load_trainer_state, load_weights, save_checkpoint
from envforge.train.samples import TurnSample

MetricsCallback = Callable[[int, dict[str, float]], None]


@dataclass
class SFTConfig:
    lr: float = 1e-3
    epochs: int = 3
    micro_batch_size: int = 8  # samples per micro-batch, or packed rows when `packing`
    grad_accum: int = 1
    max_seq_len: int = 2048  # samples are truncated to it (oldest prompt tokens first); packing row length
    warmup_ratio: float = 0.05
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    eval_every: int = 50  # steps; eval also runs after the last step
    save_every: int = 0  # steps; 0 = only the final checkpoint (when out_dir is given)
    seed: int = 0
    dtype: str = "auto"  # "auto": bf16 autocast on CUDA, fp32 on CPU; or "bf16" / "fp32"
    lr_schedule: str = "cosine"  # "cosine" | "linear" | "constant" (after linear warmup)
    packing: bool = False
    chunk_tokens: int = 1024  # vocabulary-projection chunk (see batching.token_logprobs)
    pad_id: int = 0
    fused_adam: bool | None = None  # None: fused on CUDA
    betas: tuple[float, float] = (0.9, 0.999)


@dataclass
class SFTResult:
    steps: list[int] = field(default_factory=list)  # global step index of each entry in `losses`
    losses: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    eval_losses: list[tuple[int, float]] = field(default_factory=list)  # (step, loss)
    tokens_per_s: float = 0.0  # all tokens (prompt + completion) through the model, per second of training
    train_tokens: int = 0  # completion (loss) tokens trained on
    total_steps: int = 0
    train_time_s: float = 0.0
    final_checkpoint: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["final_checkpoint"] = str(self.final_checkpoint) if self.final_checkpoint else None
        return d


# -- shared by SFT and GRPO -------------------------------------------------------------------------


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def autocast_for(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA for "auto"/"bf16"; none for fp32 (and for "auto" on CPU, where
    bf16 matmuls are slow). Parameters stay in their own dtype: fp32 master weights."""
    if dtype not in ("auto", "bf16", "fp32"):
        raise ValueError(f"dtype must be auto, bf16 or fp32, not {dtype!r}")
    if dtype == "fp32" or (dtype == "auto" and device.type != "cuda"):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def lr_factor(step: int, *, total_steps: int, warmup_steps: int, schedule: str) -> float:
    """Multiplier of the base lr at optimizer step `step` (0-based): linear warmup from
    1/(warmup+1), then constant, linear or cosine decay towards 0 at `total_steps`."""
    if schedule not in ("cosine", "linear", "constant"):
        raise ValueError(f"unknown lr schedule {schedule!r}")
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(
    model: torch.nn.Module,
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.999),
    fused: bool | None = None,
) -> torch.optim.AdamW:
    """AdamW over trainable parameters; matrices decay, vectors (norms, biases) do not.
    Fused (one kernel for all parameters) on CUDA unless told otherwise."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    if fused is None:
        fused = bool(params) and all(p.is_cuda for p in params)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused or None)


def build_scheduler(
    optimizer: torch.optim.Optimizer, *, total_steps: int, warmup_steps: int, schedule: str
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, total_steps=total_steps, warmup_steps=warmup_steps, schedule=schedule)
    )


# -- loss -------------------------------------------------------------------------------------------


def sft_loss(
    model: torch.nn.Module, batch: Batch, *, normalizer: int | None = None, chunk_tokens: int = 1024
) -> tuple[torch.Tensor, int]:
    """Summed NLL of the batch's completion tokens divided by `normalizer` (default: the batch's
    own completion-token count), and that count."""
    n = batch.n_loss_tokens
    logprobs, _ = token_logprobs(model, batch, chunk_tokens=chunk_tokens, with_entropy=False)
    return -(logprobs.sum()) / max(1, normalizer if normalizer is not None else n), n


@torch.no_grad()
def eval_loss(model: torch.nn.Module, samples: Sequence[TurnSample], config: SFTConfig) -> float:
    """Token-mean NLL over the completion tokens of `samples` (model in eval mode meanwhile)."""
    if not samples:
        return float("nan")
    device = model_device(model)
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for i in range(0, len(samples), config.micro_batch_size):
            batch = collate(
                samples[i : i + config.micro_batch_size], max_seq_len=config.max_seq_len, pad_id=config.pad_id
            ).to(device)
            with autocast_for(device, config.dtype):
                logprobs, _ = token_logprobs(model, batch, chunk_tokens=config.chunk_tokens, with_entropy=False)
            total += -float(logprobs.sum())
            count += batch.n_loss_tokens
    finally:
        model.train(was_training)
    return total / max(1, count)


# -- data order -------------------------------------------------------------------------------------


def _epoch_micro_batches(
    samples: Sequence[TurnSample], config: SFTConfig, epoch: int
) -> list[list[int] | list[list[int]]]:
    """The epoch's micro-batches as sample indices (padded) or lists of rows (packed), in order."""
    gen = torch.Generator().manual_seed(config.seed * 1_000_003 + epoch)
    if config.packing:
        rows = pack_rows([s.n_tokens for s in samples], config.max_seq_len)
        order = torch.randperm(len(rows), generator=gen).tolist()
        rows = [rows[i] for i in order]
        return [rows[i : i + config.micro_batch_size] for i in range(0, len(rows), config.micro_batch_size)]
    order = torch.randperm(len(samples), generator=gen).tolist()
    return [order[i : i + config.micro_batch_size] for i in range(0, len(order), config.micro_batch_size)]


def _make_batch(samples: Sequence[TurnSample], mb: Any, config: SFTConfig) -> Batch:
    if config.packing:
        return collate_rows(samples, mb, pad_id=config.pad_id)
    return collate([samples[i] for i in mb], pad_id=config.pad_id)


def _steps(samples: Sequence[TurnSample], config: SFTConfig) -> Iterator[tuple[int, list[Any]]]:
    """(epoch, micro-batches of one optimizer step) for the whole run."""
    for epoch in range(config.epochs):
        mbs = _epoch_micro_batches(samples, config, epoch)
        for i in range(0, len(mbs), config.grad_accum):
            yield epoch, mbs[i : i + config.grad_accum]


def steps_per_epoch(n_samples: int, config: SFTConfig, samples: Sequence[TurnSample] | None = None) -> int:
    if config.packing:
        if samples is None:
            raise ValueError("packing needs the samples to count rows")
        n_units = len(pack_rows([s.n_tokens for s in samples], config.max_seq_len))
    else:
        n_units = n_samples
    n_micro = math.ceil(n_units / config.micro_batch_size)
    return math.ceil(n_micro / config.grad_accum)


# -- training ---------------------------------------------------------------------------------------


def train_sft(
    model: PreTrainedModel,
    train: list[TurnSample],
    eval: list[TurnSample],
    config: SFTConfig,
    *,
    out_dir: str | Path | None = None,
    on_metrics: MetricsCallback | None = None,
    resume_from: str | Path | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> SFTResult:
    """Fine-tune `model` in place on the completion tokens of `train`; returns per-step metrics.

    `on_metrics(step, metrics)` gets each step's loss, lr, grad_norm, tokens and tokens/s (and
    eval_loss on eval steps); `lambda s, m: envforge.track.log_metrics(m, step=s)` sends them to
    the active MLflow run. With `out_dir`, checkpoints `step-<n>` are written every
    `save_every` steps and after the last (with `tokenizer` when given, so they serve).
    `resume_from` (a checkpoint directory) loads its weights, optimizer, scheduler and RNG
    states and continues from its step."""
    if not train:
        raise ValueError("no training samples")
    if config.grad_accum < 1 or config.micro_batch_size < 1:
        raise ValueError("micro_batch_size and grad_accum must be >= 1")
    train = [truncate(s, config.max_seq_len) for s in train]
    eval = list(eval)
    device = model_device(model)
    per_epoch = steps_per_epoch(len(train), config, train)
    total = per_epoch * config.epochs
    warmup = int(math.ceil(config.warmup_ratio * total))
    optimizer = build_optimizer(
        model, lr=config.lr, weight_decay=config.weight_decay, betas=config.betas, fused=config.fused_adam
    )
    scheduler = build_scheduler(optimizer, total_steps=total, warmup_steps=warmup, schedule=config.lr_schedule)
    start = 0
    if resume_from is not None:
        load_weights(model, resume_from)
        start = load_trainer_state(resume_from, optimizer, scheduler)
    else:
        torch.manual_seed(config.seed)  # dropout etc.; data order has its own generator
    result = SFTResult(total_steps=total)
    out = Path(out_dir) if out_dir is not None else None
    model.train()
    seen_tokens, busy = 0, 0.0
    step = start
    for global_step, (_epoch, mbs) in enumerate(_steps(train, config)):
        if global_step < start:
            continue
        t0 = time.perf_counter()
        batches = [_make_batch(train, mb, config).to(device) for mb in mbs]
        n_tokens = sum(b.n_loss_tokens for b in batches)
        optimizer.zero_grad(set_to_none=True)
        loss_value = 0.0
        for batch in batches:
            with autocast_for(device, config.dtype):
                loss, _ = sft_loss(model, batch, normalizer=n_tokens, chunk_tokens=config.chunk_tokens)
            loss.backward()
            loss_value += float(loss.detach())
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm))
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        scheduler.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        real = sum(b.n_real_tokens for b in batches)
        seen_tokens += real
        busy += dt
        step = global_step + 1
        result.steps.append(global_step)
        result.losses.append(loss_value)
        result.lrs.append(lr)
        result.grad_norms.append(grad_norm)
        result.train_tokens += n_tokens
        metrics = {
            "loss": loss_value,
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens": float(n_tokens),
            "tokens_per_s": real / dt if dt > 0 else 0.0,
            "step_time_s": dt,
        }
        if eval and (step % max(1, config.eval_every) == 0 or step == total):
            metrics["eval_loss"] = eval_loss(model, eval, config)
            result.eval_losses.append((step, metrics["eval_loss"]))
        live.train_step(metrics, "sft")
        if out is not None and ((config.save_every and step % config.save_every == 0) or step == total):
            result.final_checkpoint = save_checkpoint(
                out / f"step-{step}",
                model,
                tokenizer,
                optimizer=optimizer,
                scheduler=scheduler,
                step=step,
                extra={"sft_config": asdict(config)},
            )
        if on_metrics is not None:
            on_metrics(step, metrics)
    result.train_time_s = busy
    result.tokens_per_s = seen_tokens / busy if busy > 0 else 0.0
    model.eval()
    return result
