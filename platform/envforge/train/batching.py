"""Turn `TurnSample`s into model inputs, and completion-token log-probs out of a model.

Layout. Every per-token tensor is aligned with `input_ids` ([B, S]): position t holds
something about token t. `loss_mask[b, t]` is True when token t is a completion token that
can be predicted (it has a preceding token of the same sample), `behaviour_logprobs[b, t]`
is the sampler's log-prob of that token and `advantages[b, t]` its sample's advantage. So
`token_logprobs(model, batch)[b, t] = log p(input_ids[b, t] | input_ids[b, :t])` lines up
with all of them, and a loss is a masked sum over [B, S] whether rows are padded or packed.
`labels` is the Hugging Face convention (a copy of input_ids with -100 off the completion),
so `model(input_ids, labels=labels).loss` is the same SFT loss, which the benchmark and
tests use as a cross-check.

Padding is on the right. Under causal attention a real token never sees a later pad, so a
right-padded batch needs no attention mask at all; the forward passes none, which keeps
SDPA/flash on the fast `is_causal` path. Packing puts several samples in one row with
`position_ids` restarting at 0 for each: transformers 5 detects the restarts (when no
attention mask is given and no cache is used) and builds a block-diagonal causal mask for
SDPA/eager, or uses varlen kernels for flash-attention, so samples never attend to each other
(tested: a packed row gives the same log-probs as the samples alone).

Memory. The vocabulary projection of a 151936-token vocabulary at 8x2048 tokens is 10 GB of
fp32 logits, more with the softmax and its gradient. `token_logprobs` only projects the
positions that predict completion tokens, a chunk of them at a time, and recomputes each
chunk in the backward pass (activation checkpointing), so at most one chunk of logits is
alive at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
from torch.utils.checkpoint import checkpoint

from envforge.train.samples import TurnSample

IGNORE_INDEX = -100


@dataclass
class Batch:
    """Padded (or packed) tensors for one micro-batch; see the module docstring for the layout."""

    input_ids: torch.Tensor  # [B, S] long
    attention_mask: torch.Tensor  # [B, S] long, 1 on real tokens (informational: the forward uses position_ids)
    position_ids: torch.Tensor  # [B, S] long, restarting at 0 for each sample
    loss_mask: torch.Tensor  # [B, S] bool, predictable completion tokens
    labels: torch.Tensor  # [B, S] long, input_ids with IGNORE_INDEX off the loss mask (HF convention)
    behaviour_logprobs: torch.Tensor  # [B, S] float32, 0 off the loss mask
    advantages: torch.Tensor  # [B, S] float32, the sample's advantage on its loss-mask tokens
    sample_index: torch.Tensor  # [B, S] long, index of the sample each token belongs to, -1 on padding
    n_samples: int
    packed: bool = False

    @property
    def n_loss_tokens(self) -> int:
        return int(self.loss_mask.sum().item())

    @property
    def n_real_tokens(self) -> int:
        return int(self.attention_mask.sum().item())

    def to(self, device: torch.device | str) -> "Batch":
        moved = {
            k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()
        }
        return Batch(**moved)


def truncate(sample: TurnSample, max_seq_len: int) -> TurnSample:
    """Fit a sample in `max_seq_len` tokens: drop prompt tokens from the left (the oldest context)
    and keep at least one, then, only if still needed, the tail of the completion.

    Dropping old context keeps every trained token; cutting the completion would train on a
    turn the policy never finished. For RL this changes the conditioning of the behaviour
    log-probs, which is why GRPO never truncates."""
    if sample.n_tokens <= max_seq_len:
        return sample
    if max_seq_len < 2:
        raise ValueError("max_seq_len must be >= 2")
    keep_prompt = max(1, max_seq_len - len(sample.completion_ids)) if sample.prompt_ids else 0
    prompt = sample.prompt_ids[len(sample.prompt_ids) - keep_prompt :] if keep_prompt else []
    n_completion = max_seq_len - len(prompt)
    lps = sample.behaviour_logprobs[:n_completion] if sample.behaviour_logprobs is not None else None
    return TurnSample(
        prompt_ids=list(prompt),
        completion_ids=sample.completion_ids[:n_completion],
        behaviour_logprobs=lps,
        advantage=sample.advantage,
        reward=sample.reward,
        group_id=sample.group_id,
        trajectory_id=sample.trajectory_id,
        policy_version=sample.policy_version,
    )


def pack_rows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """First-fit-decreasing bin packing of sample indices into rows of at most `capacity` tokens.

    Deterministic (ties keep input order). A sample longer than the capacity gets a row alone."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = []
    free: list[int] = []
    for i in order:
        n = lengths[i]
        for r, room in enumerate(free):
            if n <= room:
                rows[r].append(i)
                free[r] -= n
                break
        else:
            rows.append([i])
            free.append(capacity - n)
    return rows


def collate(
    samples: Sequence[TurnSample],
    *,
    pack: bool = False,
    pack_len: int | None = None,
    max_seq_len: int | None = None,
    rows: Sequence[Sequence[int]] | None = None,
    pad_id: int = 0,
    pad_to: int | None = None,
    pad_to_multiple_of: int = 1,
) -> Batch:
    """Collate samples into one `Batch`.

    pack=False: one sample per row, right-padded to the longest (or `pad_to`). pack=True:
    samples are bin-packed into rows of `pack_len` tokens (default `max_seq_len`) with
    restarting position ids, or laid out as the explicit `rows` of sample indices.
    `max_seq_len` truncates samples (see `truncate`) when given; GRPO passes none.
    `pad_to_multiple_of` rounds the row length up (tensor-core friendly shapes, fewer
    recompiles under torch.compile). The first token of a sample is never in the loss mask:
    nothing of the same sample precedes it (in a packed row the token before it belongs to
    another sample)."""
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    if max_seq_len:
        samples = [truncate(s, max_seq_len) for s in samples]
    if rows is not None:
        pack = True
    elif pack:
        capacity = pack_len or max_seq_len
        if not capacity:
            raise ValueError("packing needs pack_len or max_seq_len (the row capacity)")
        rows = pack_rows([s.n_tokens for s in samples], capacity)
    else:
        rows = [[i] for i in range(len(samples))]
    width = max(sum(samples[i].n_tokens for i in row) for row in rows)
    if pad_to is not None:
        width = max(width, pad_to)
    width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    shape = (len(rows), width)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    attention = torch.zeros(shape, dtype=torch.long)
    positions = torch.zeros(shape, dtype=torch.long)
    loss_mask = torch.zeros(shape, dtype=torch.bool)
    behaviour = torch.zeros(shape, dtype=torch.float32)
    advantages = torch.zeros(shape, dtype=torch.float32)
    sample_index = torch.full(shape, -1, dtype=torch.long)
    for r, row in enumerate(rows):
        col = 0
        for i in row:
            s = samples[i]
            n_p, n_c = len(s.prompt_ids), len(s.completion_ids)
            n = n_p + n_c
            input_ids[r, col : col + n] = torch.tensor(s.prompt_ids + s.completion_ids, dtype=torch.long)
            attention[r, col : col + n] = 1
            positions[r, col : col + n] = torch.arange(n)
            sample_index[r, col : col + n] = i
            first = col + max(n_p, 1)  # a completion token with no prompt before it cannot be predicted
            loss_mask[r, first : col + n] = True
            advantages[r, col + n_p : col + n] = s.advantage
            if s.behaviour_logprobs is not None:
                behaviour[r, col + n_p : col + n] = torch.tensor(s.behaviour_logprobs, dtype=torch.float32)
            col += n
        # padding: in a packed row it is one more "sample" (positions restart); in a padded row its
        # positions continue, so transformers sees no packing and keeps the plain causal fast path
        positions[r, col:] = torch.arange(width - col) + (0 if pack else col)
    advantages = advantages * loss_mask
    behaviour = behaviour * loss_mask
    labels = torch.where(loss_mask, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    return Batch(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=positions,
        loss_mask=loss_mask,
        labels=labels,
        behaviour_logprobs=behaviour,
        advantages=advantages,
        sample_index=sample_index,
        n_samples=len(samples),
        packed=pack,
    )


def micro_batches(
    samples: Sequence[TurnSample],
    micro_batch_size: int,
    *,
    pack: bool = False,
    pack_len: int | None = None,
    max_seq_len: int | None = None,
    pad_id: int = 0,
    pad_to_multiple_of: int = 1,
) -> list[Batch]:
    """Split samples (in order) into micro-batches: `micro_batch_size` samples each, or, when
    packing, `micro_batch_size` packed rows of `pack_len` (default `max_seq_len`) tokens each.
    Packing is done over all samples at once, so rows are as full as the lengths allow."""
    if micro_batch_size < 1:
        raise ValueError("micro_batch_size must be >= 1")
    if not samples:
        return []
    if max_seq_len:
        samples = [truncate(s, max_seq_len) for s in samples]
    if not pack:
        return [
            collate(samples[i : i + micro_batch_size], pad_id=pad_id, pad_to_multiple_of=pad_to_multiple_of)
            for i in range(0, len(samples), micro_batch_size)
        ]
    capacity = pack_len or max_seq_len
    if not capacity:
        raise ValueError("packing needs pack_len or max_seq_len (the row capacity)")
    rows = pack_rows([s.n_tokens for s in samples], capacity)
    return [
        collate_rows(samples, rows[i : i + micro_batch_size], pad_id=pad_id, pad_to_multiple_of=pad_to_multiple_of)
        for i in range(0, len(rows), micro_batch_size)
    ]


def collate_rows(
    samples: Sequence[TurnSample], rows: Sequence[Sequence[int]], *, pad_id: int = 0, pad_to_multiple_of: int = 1
) -> Batch:
    """Collate the packed `rows` (lists of indices into `samples`) into one batch."""
    chosen = [samples[i] for row in rows for i in row]
    local, k = [], 0
    for row in rows:
        local.append(list(range(k, k + len(row))))
        k += len(row)
    return collate(chosen, rows=local, pad_id=pad_id, pad_to_multiple_of=pad_to_multiple_of)


def forward_hidden(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Final hidden states [B, S, H] of the decoder, without the vocabulary projection.

    Padded rows pass no attention mask (right padding is invisible under causal attention);
    packed rows pass none either, so transformers builds the per-sample mask from the
    restarting position ids. `use_cache=False` matters: with a cache, packing is not detected."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.base_model
    out = base(input_ids=batch.input_ids, position_ids=batch.position_ids, attention_mask=None, use_cache=False)
    return out.last_hidden_state


def _chunk_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    inv_temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.nn.functional.linear(hidden, weight, bias).float()
    if inv_temperature != 1.0:
        logits = logits * inv_temperature
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
    if not with_entropy:
        return logp, torch.zeros_like(logp)
    probs = torch.softmax(logits, dim=-1)
    entropy = lse - (probs * logits).sum(-1)
    return logp, entropy


def token_logprobs(
    model: torch.nn.Module,
    batch: Batch,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    with_entropy: bool = True,
    hidden: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs [B, S] of the loss-mask tokens under `model` (0 elsewhere), and the entropy [B, S]
    of the predictive distribution at those tokens.

    Only loss-mask positions are projected onto the vocabulary, `chunk_tokens` at a time, in
    float32, each chunk recomputed in the backward pass when gradients are on: peak logits
    memory is chunk_tokens x vocab x 4 bytes (x3 with softmax and entropy), not B x S x vocab.
    `temperature` divides the logits, matching how `HFPolicy` (and vLLM) record behaviour
    log-probs, so ratios compare like with like."""
    if temperature <= 0:
        raise ValueError("temperature must be > 0 for log-probs")
    if hidden is None:
        hidden = forward_hidden(model, batch)
    head = model.get_output_embeddings()
    b, s, h = hidden.shape
    flat_mask = batch.loss_mask.reshape(-1)
    idx = flat_mask.nonzero().squeeze(-1)  # positions whose token is scored; never column 0
    src = hidden.reshape(b * s, h).index_select(0, idx - 1)  # hidden state of the previous token
    targets = batch.input_ids.reshape(-1).index_select(0, idx)
    weight, bias = head.weight, getattr(head, "bias", None)
    use_ckpt = torch.is_grad_enabled() and (src.requires_grad or weight.requires_grad)
    lps, ents = [], []
    for start in range(0, src.shape[0], chunk_tokens):
        args = (
            src[start : start + chunk_tokens],
            weight,
            bias,
            targets[start : start + chunk_tokens],
            1.0 / temperature,
            with_entropy,
        )
        lp, ent = checkpoint(_chunk_logprobs, *args, use_reentrant=False) if use_ckpt else _chunk_logprobs(*args)
        lps.append(lp)
        ents.append(ent)
    device = hidden.device
    lp_all = torch.cat(lps) if lps else torch.zeros(0, device=device)
    ent_all = torch.cat(ents) if ents else torch.zeros(0, device=device)
    zeros = torch.zeros(b * s, dtype=torch.float32, device=device)
    logprobs = zeros.index_put((idx,), lp_all).reshape(b, s)
    entropy = zeros.index_put((idx,), ent_all).reshape(b, s)
    return logprobs, entropy


def per_sample_mean(values: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Mean of `values` over each sample's loss-mask tokens: [n_samples] (0 for a sample with none).

    What "seq-mean" aggregation averages; works for padded and packed rows alike."""
    mask = batch.loss_mask.reshape(-1)
    index = batch.sample_index.reshape(-1).clamp(min=0)
    sums = torch.zeros(batch.n_samples, dtype=values.dtype, device=values.device)
    sums = sums.index_add(0, index, values.reshape(-1) * mask)
    counts = torch.zeros(batch.n_samples, dtype=values.dtype, device=values.device)
    counts = counts.index_add(0, index, mask.to(values.dtype))
    return sums / counts.clamp(min=1)


def count_loss_tokens(batches: Iterable[Batch]) -> int:
    return sum(b.n_loss_tokens for b in batches)
