"""Training throughput on one GPU: a plain transformers step vs envforge's SFT and GRPO steps.

    .venv/bin/python bench/train_gpu.py [--compile] [--pack] [--attn sdpa|flash_attention_2|eager] ...
    .venv/bin/python bench/train_gpu.py --smoke      # tiny shape on CPU, seconds (CI / tests)

The model is the Qwen2.5-0.5B shape built from config (hidden 896, 24 layers, 14 heads, 2 KV
heads, intermediate 4864, vocab 151936, tied embeddings), randomly initialised, parameters in
bf16; batches are 8 rows x 2048 random tokens. Three steps are timed, each on a fresh model:
- baseline: `model(input_ids, labels=input_ids).loss.backward()` + torch AdamW (foreach);
- sft: envforge's path: `batching.collate` (or packing), `sft.sft_loss` (completion-only NLL
  through the chunked vocabulary projection of `batching.token_logprobs`), grad clipping,
  `sft.build_optimizer` (fused AdamW on CUDA);
- grpo: `grpo.grpo_update` on samples with random behaviour log-probs and advantages.
Levers: --compile (torch.compile each decoder layer), --pack (variable-length samples packed
into full rows; without it every row is one full-length sample), --chunk-tokens, --attn,
--grad-ckpt, --param-dtype. Prints one JSON document; model FLOPs utilization uses the
formula stated in it. Exits 2 with a message when there is no GPU and no --smoke.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "platform"))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, Qwen2Config  # noqa: E402

from envforge.train.batching import collate, micro_batches  # noqa: E402
from envforge.train.grpo import GRPOConfig, grpo_update  # noqa: E402
from envforge.train.samples import TurnSample  # noqa: E402
from envforge.train.sft import autocast_for, build_optimizer, sft_loss  # noqa: E402

H200_BF16_PEAK = 989e12  # dense bf16 tensor-core FLOP/s of an H200 (SXM), no sparsity
FLOPS_FORMULA = ("model_flops_per_token = 6 * params + 12 * layers * hidden * T (forward + backward; params = all "
                 "parameters counted once, with tied embeddings that is the non-embedding params plus the lm_head "
                 "matmul; T = token-weighted mean sample length, = seq_len for full rows; attention term as in "
                 "PaLM, not halved for causality); mfu = tokens_per_s * model_flops_per_token / peak_flops. "
                 "Recomputation (chunked logits in backward, --grad-ckpt) is not counted.")

FULL = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
            intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768, rope_theta=1_000_000.0,
            rms_norm_eps=1e-6, tie_word_embeddings=True)
SMOKE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=1000, max_position_embeddings=512, tie_word_embeddings=True)


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def build_model(args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    shape = SMOKE if args.smoke else FULL
    config = Qwen2Config(**shape, pad_token_id=0, bos_token_id=None, eos_token_id=None, use_cache=False)
    dtype = torch.bfloat16 if args.param_dtype == "bf16" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation=args.attn, dtype=dtype)
    model.train()
    if args.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.compile:
        for layer in model.model.layers:
            layer.compile(dynamic=False)
    return model


def make_samples(args: argparse.Namespace, vocab: int, *, rl: bool) -> list[TurnSample]:
    """B full-length rows of random tokens (prompt of `prompt_len`), or with --pack random-length
    samples adding up to the same B x S tokens."""
    g = torch.Generator().manual_seed(1)
    total = args.batch * args.seq
    lengths: list[int] = []
    if args.pack:
        while sum(lengths) < total:
            lengths.append(int(torch.randint(args.seq // 8, args.seq + 1, (1,), generator=g)))
        lengths[-1] -= sum(lengths) - total
        lengths = [n for n in lengths if n > args.prompt_len + 1]
    else:
        lengths = [args.seq] * args.batch
    samples = []
    for n in lengths:
        ids = torch.randint(1, vocab, (n,), generator=g).tolist()
        n_c = n - args.prompt_len
        # near a random init's log-probs (-log vocab), so ratios stay near 1 as in real GRPO
        behaviour = (-math.log(vocab) + 0.1 * torch.randn(n_c, generator=g)).tolist() if rl else None
        adv = float(torch.randn(1, generator=g)) if rl else 0.0
        samples.append(TurnSample(prompt_ids=ids[:args.prompt_len], completion_ids=ids[args.prompt_len:],
                                  behaviour_logprobs=behaviour, advantage=adv, reward=adv, group_id="g",
                                  trajectory_id=str(len(samples))))
    return samples


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(step, args: argparse.Namespace, device: torch.device) -> dict:
    for _ in range(args.warmup):
        step()
    sync(device)
    times, last = [], {}
    for _ in range(args.steps):
        t0 = time.perf_counter()
        last = step()
        sync(device)
        times.append(time.perf_counter() - t0)
    return {"step_time_s": statistics.median(times), "step_times_s": [round(t, 5) for t in times], **last}


def run_mode(mode: str, args: argparse.Namespace, device: torch.device) -> dict:
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    model = build_model(args, device)
    params = sum(p.numel() for p in model.parameters())
    vocab = model.config.vocab_size
    samples = make_samples(args, vocab, rl=(mode == "grpo"))
    real_tokens = sum(s.n_tokens for s in samples)

    if mode == "baseline":
        ids = torch.randint(1, vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(1)).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        real_tokens = ids.numel()

        def step() -> dict:
            opt.zero_grad(set_to_none=True)
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            opt.step()
            return {"loss": float(loss.detach())}

    elif mode == "sft":
        opt = build_optimizer(model, lr=1e-5, weight_decay=0.0, fused=None if not args.no_fused_adam else False)
        if args.pack:
            batches = micro_batches(samples, args.batch, pack=True, pack_len=args.seq)
        else:
            batches = [collate(samples)]
        batches = [b.to(device) for b in batches]
        n_loss = sum(b.n_loss_tokens for b in batches)

        def step() -> dict:
            opt.zero_grad(set_to_none=True)
            total = 0.0
            for b in batches:
                with autocast_for(device, "auto"):
                    loss, _ = sft_loss(model, b, normalizer=n_loss, chunk_tokens=args.chunk_tokens)
                loss.backward()
                total += float(loss.detach())
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
            opt.step()
            return {"loss": total, "grad_norm": gn, "rows": sum(b.input_ids.shape[0] for b in batches)}

    elif mode == "grpo":
        cfg = GRPOConfig(lr=1e-6, micro_batch_size=args.batch, packing=args.pack, pack_len=args.seq,
                         chunk_tokens=args.chunk_tokens, fused_adam=False if args.no_fused_adam else None)
        opt = build_optimizer(model, lr=cfg.lr, weight_decay=0.0, fused=cfg.fused_adam)

        def step() -> dict:
            m = grpo_update(model, None, opt, None, samples, cfg)
            return {k: m[k] for k in ("loss", "clip_fraction", "entropy", "grad_norm")}

    else:
        raise ValueError(mode)

    result = timed(step, args, device)
    attn_t = sum(s.n_tokens ** 2 for s in samples) / max(1, sum(s.n_tokens for s in samples))
    if mode == "baseline":
        attn_t = args.seq
    cfg_ = model.config
    flops_per_token = 6 * params + 12 * cfg_.num_hidden_layers * cfg_.hidden_size * attn_t
    tps = real_tokens / result["step_time_s"]
    result.update({
        "tokens_per_step": real_tokens, "tokens_per_s": tps, "params": params,
        "model_flops_per_token": flops_per_token, "mfu": tps * flops_per_token / H200_BF16_PEAK,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
    })
    if result["peak_memory_bytes"] is not None:
        result["peak_memory_gib"] = result["peak_memory_bytes"] / 2 ** 30
    del model, opt
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny shape on CPU (hidden 64, 2 layers, vocab 1000, 2x128)")
    ap.add_argument("--modes", default="baseline,sft,grpo")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--prompt-len", type=int, default=1,
                    help="prompt tokens per sample (not trained on); 1 = every other token is scored, like the baseline")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--compile", action="store_true", help="torch.compile each decoder layer")
    ap.add_argument("--pack", action="store_true", help="random-length samples packed into full rows")
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "flash_attention_2", "eager"])
    ap.add_argument("--chunk-tokens", type=int, default=2048)
    ap.add_argument("--grad-ckpt", action="store_true")
    ap.add_argument("--param-dtype", default=None, choices=["bf16", "fp32"])
    ap.add_argument("--no-fused-adam", action="store_true")
    args = ap.parse_args(argv)

    if args.smoke:
        device = torch.device("cpu")
        defaults = dict(batch=2, seq=128, steps=2, warmup=1, param_dtype="fp32")
    else:
        if not torch.cuda.is_available():
            print("train_gpu.py: no CUDA GPU is available. Run it on a GPU machine, or pass --smoke for the "
                  "tiny CPU check.", file=sys.stderr)
            return 2
        device = torch.device("cuda")
        defaults = dict(batch=8, seq=2048, steps=5, warmup=2, param_dtype="bf16")
        torch.backends.cuda.matmul.allow_tf32 = True
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.compile and args.warmup < 2:
        args.warmup = 2

    results = {}
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        log(f"{mode}: {args.batch}x{args.seq}, {args.warmup} warmup + {args.steps} timed steps")
        results[mode] = run_mode(mode, args, device)
        log(f"{mode}: {results[mode]['tokens_per_s']:.0f} tokens/s, mfu {results[mode]['mfu']:.3f}")
    doc = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "smoke": args.smoke,
        "shape": SMOKE if args.smoke else FULL,
        "batch": args.batch, "seq_len": args.seq, "prompt_len": args.prompt_len,
        "levers": {"compile": args.compile, "pack": args.pack, "attn": args.attn, "chunk_tokens": args.chunk_tokens,
                   "grad_ckpt": args.grad_ckpt, "param_dtype": args.param_dtype,
                   "fused_adam": device.type == "cuda" and not args.no_fused_adam},
        "peak_flops": H200_BF16_PEAK,
        "flops_formula": FLOPS_FORMULA,
        "torch": torch.__version__,
        "results": results,
    }
    if "baseline" in results:
        for mode in ("sft", "grpo"):
            if mode in results:
                doc[f"{mode}_vs_baseline_tokens_per_s"] = results[mode]["tokens_per_s"] / results["baseline"]["tokens_per_s"]
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
