"""Training on CPU with the tiny Qwen2: batching, SFT, GRPO, checkpoints, the GPU bench's smoke mode."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from envforge.rollout.policies.hf import HFPolicy
from envforge.rollout.policies.tiny import build_tiny_model
from envforge.train.batching import collate, micro_batches, per_sample_mean, token_logprobs
from envforge.train.checkpoint import load_trainer_state, log_checkpoint, save_checkpoint
from envforge.train.grpo import GRPOConfig, GRPOTrainer, group_advantages, grpo_update
from envforge.train.samples import TurnSample
from envforge.train.sft import SFTConfig, build_optimizer, sft_loss, train_sft

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model()


def fresh(tiny):
    model, tok = tiny
    return copy.deepcopy(model), tok


def rand_samples(n: int, *, seed: int = 0, vocab: int = 700, lengths=((5, 7), (9, 3), (2, 10), (6, 6))):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p, c = lengths[i % len(lengths)]
        out.append(TurnSample(prompt_ids=torch.randint(3, vocab, (p,), generator=g).tolist(),
                              completion_ids=torch.randint(3, vocab, (c,), generator=g).tolist(),
                              trajectory_id=f"t{i}"))
    return out


def full_softmax_logprobs(model, batch):
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids).logits.float()
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    out = torch.zeros_like(batch.input_ids, dtype=torch.float32)
    out[:, 1:] = lp
    return out * batch.loss_mask


# -- batching ------------------------------------------------------------------------------------------

def test_loss_mask_covers_only_completion_tokens():
    samples = [TurnSample([10, 11, 12], [20, 21]), TurnSample([13], [22, 23, 24, 25])]
    b = collate(samples, pad_id=0)
    assert b.input_ids.tolist() == [[10, 11, 12, 20, 21], [13, 22, 23, 24, 25]]
    assert b.loss_mask.tolist() == [[False, False, False, True, True], [False, True, True, True, True]]
    assert b.labels.tolist() == [[-100, -100, -100, 20, 21], [-100, 22, 23, 24, 25]]
    # padding is never trained on, and packed samples never train on their first token
    padded = collate([TurnSample([1, 2], [3]), TurnSample([4], [5, 6, 7, 8])])
    assert padded.loss_mask.tolist()[0] == [False, False, True, False, False]
    packed = collate([TurnSample([], [3, 4]), TurnSample([5], [6])], pack=True, pack_len=8)
    assert packed.input_ids.tolist() == [[3, 4, 5, 6]]
    assert packed.position_ids.tolist() == [[0, 1, 0, 1]]
    assert packed.loss_mask.tolist() == [[False, True, False, True]]


def test_behaviour_logprobs_and_advantages_align_with_completion():
    s = TurnSample([1, 2], [3, 4], behaviour_logprobs=[-0.5, -1.5], advantage=2.0)
    b = collate([s, TurnSample([1], [2, 3, 4, 5])])
    assert b.behaviour_logprobs[0].tolist() == [0.0, 0.0, -0.5, -1.5, 0.0]
    assert b.advantages[0].tolist() == [0.0, 0.0, 2.0, 2.0, 0.0]


def test_token_logprobs_matches_full_softmax(tiny):
    model, _ = tiny
    b = collate(rand_samples(4))
    lp, ent = token_logprobs(model, b, chunk_tokens=5)  # several chunks
    ref = full_softmax_logprobs(model, b)
    assert torch.allclose(lp, ref, atol=1e-5)
    assert (ent[b.loss_mask] > 0).all() and (ent[~b.loss_mask] == 0).all()
    # the HF loss on `labels` is the same token-mean NLL
    with torch.no_grad():
        hf = model(input_ids=b.input_ids, labels=b.labels).loss
    assert torch.allclose(-(lp.sum() / b.n_loss_tokens), hf, atol=1e-5)


def test_packed_rows_do_not_leak_attention(tiny):
    model, _ = tiny
    samples = rand_samples(4)
    b = collate(samples)
    packed = collate(samples, pack=True, pack_len=25)
    assert packed.input_ids.shape[0] == 2
    with torch.no_grad():
        alone = per_sample_mean(token_logprobs(model, b)[0], b)
        together = per_sample_mean(token_logprobs(model, packed)[0], packed)
    assert torch.allclose(alone, together, atol=1e-5)
    assert len(micro_batches(samples, 1, pack=True, pack_len=25)) == 2


# -- SFT -----------------------------------------------------------------------------------------------

def test_sft_overfits_a_small_batch_and_changes_weights(tiny):
    model, _ = fresh(tiny)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    samples = rand_samples(4)
    cfg = SFTConfig(lr=3e-3, epochs=30, micro_batch_size=4, warmup_ratio=0.0, lr_schedule="constant",
                    eval_every=10)
    res = train_sft(model, samples, samples[:2], cfg)
    assert len(res.losses) == 30 and all(torch.isfinite(torch.tensor(res.losses)))
    assert res.losses[-1] < 0.5 * res.losses[0]
    assert res.eval_losses and res.eval_losses[-1][1] < res.eval_losses[0][1]
    assert res.tokens_per_s > 0
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert "model.embed_tokens.weight" in changed and any("layers.1.mlp" in k for k in changed)


def test_grad_accumulation_equals_big_batch(tiny):
    samples = rand_samples(4)
    grads = []
    for mbs, accum in ((4, 1), (1, 4)):
        model, _ = fresh(tiny)
        model.train()
        batches = micro_batches(samples, mbs)
        n = sum(b.n_loss_tokens for b in batches)
        for b in batches:
            sft_loss(model, b, normalizer=n)[0].backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_checkpoint_roundtrip_logits_and_greedy_policy(tiny, tmp_path):
    model, tok = fresh(tiny)
    train_sft(model, rand_samples(4), [], SFTConfig(epochs=3, micro_batch_size=4))
    path = save_checkpoint(tmp_path / "ckpt", model, tok, step=3)
    names = {p.name for p in path.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer_config.json",
            "trainer_state.pt"} <= names
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # temp dir renamed away
    loaded = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32).eval()
    ids = torch.tensor([rand_samples(1)[0].prompt_ids + rand_samples(1)[0].completion_ids])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, loaded(input_ids=ids).logits)
    messages = [{"role": "user", "content": "fix the tests"}]
    a = HFPolicy(model, tok).generate(messages, None, seed=0, temperature=0, max_tokens=12)
    b = HFPolicy(path).generate(messages, None, seed=0, temperature=0, max_tokens=12)
    assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-6)
    save_checkpoint(path, model, tok, step=4)  # overwriting is atomic too
    assert load_trainer_state(path) == 4


def test_resume_continues_like_an_uninterrupted_run(tiny, tmp_path):
    samples = rand_samples(8)
    cfg = SFTConfig(lr=1e-3, epochs=2, micro_batch_size=2, grad_accum=2, save_every=2, eval_every=100)
    full_model, tok = fresh(tiny)
    full = train_sft(full_model, samples, [], cfg, out_dir=tmp_path / "a", tokenizer=tok)
    assert full.total_steps == 4 and full.final_checkpoint == tmp_path / "a" / "step-4"
    resumed_model, _ = fresh(tiny)
    torch.manual_seed(1234)  # the RNG state comes from the checkpoint, not from here
    resumed = train_sft(resumed_model, samples, [], cfg, resume_from=tmp_path / "a" / "step-2")
    assert resumed.steps == [2, 3]
    assert resumed.losses == pytest.approx(full.losses[2:], abs=1e-6)
    for p, q in zip(full_model.parameters(), resumed_model.parameters()):
        assert torch.allclose(p, q, atol=1e-6)


# -- GRPO ----------------------------------------------------------------------------------------------

def _rl_groups():
    s = rand_samples(6)
    return {"a": [(1.0, [s[0], s[1]]), (0.0, [s[2]])], "b": [(1.0, [s[3]]), (1.0, [s[4]])], "c": [(0.5, [s[5]])]}


def test_group_advantages_normalized_and_equal_groups_skipped():
    out, stats = group_advantages(_rl_groups())
    assert stats.groups == 3 and stats.skipped_groups == 2 and stats.trajectories == 5
    assert [s.advantage for s in out] == pytest.approx([1.0, 1.0, -1.0], abs=1e-5)
    assert stats.reward_mean == pytest.approx(3.5 / 5)
    kept, stats = group_advantages(_rl_groups(), equal_reward_groups="keep", scale=False)
    assert stats.skipped_groups == 0 and len(kept) == 6
    by_group: dict[str, list[float]] = {}
    for s in kept:
        by_group.setdefault(s.group_id, []).append(s.advantage)
    assert by_group["b"] == [0.0, 0.0] and by_group["c"] == [0.0]
    # flat samples with group/trajectory ids and rewards work the same; mean 0 within a group
    flat = [TurnSample([1], [2], reward=r, group_id="g", trajectory_id=f"t{i}") for i, r in enumerate([0, 1, 1, 0.5])]
    out, _ = group_advantages(flat)
    assert sum(s.advantage for s in out) == pytest.approx(0.0, abs=1e-6)


def _with_behaviour(model, samples, shift=0.0):
    b = collate(samples)
    with torch.no_grad():
        lp, _ = token_logprobs(model, b)
    out = []
    for i, s in enumerate(samples):
        row = lp[i, len(s.prompt_ids):len(s.prompt_ids) + len(s.completion_ids)].tolist()
        if not s.prompt_ids:
            row[0] = 0.0
        out.append(TurnSample(s.prompt_ids, s.completion_ids, behaviour_logprobs=[x + shift for x in row],
                              advantage=s.advantage, reward=s.reward, group_id=s.group_id,
                              trajectory_id=s.trajectory_id))
    return out


def test_grpo_clipping_kl_and_logprob_direction(tiny):
    model, tok = fresh(tiny)
    samples, _ = group_advantages(_rl_groups())
    on_policy = _with_behaviour(model, samples)
    ref = copy.deepcopy(model)
    opt = build_optimizer(model, lr=1e-6, weight_decay=0.0)
    m = grpo_update(model, ref, opt, None, on_policy, GRPOConfig(lr=1e-6, kl_coef=0.1))
    assert m["kl"] == pytest.approx(0.0, abs=1e-7) and m["clip_fraction"] == 0.0
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert {"loss", "entropy", "grad_norm", "tokens", "tokens_per_s", "reward_mean", "reward_std",
            "skipped_groups"} <= set(m)
    # behaviour log-probs lower than the model's: ratio > 1 + eps_high, clipped for positive advantages
    shifted = _with_behaviour(model, samples, shift=-1.0)
    m = grpo_update(model, None, build_optimizer(model, lr=0.0, weight_decay=0.0), None, shifted,
                    GRPOConfig(lr=0.0))
    assert m["clip_fraction"] > 0 and m["ratio_mean"] > 2.0

    model, _ = fresh(tiny)
    samples = _with_behaviour(model, samples)
    b = collate(samples)
    before = per_sample_mean(token_logprobs(model, b)[0], b).detach()
    trainer = GRPOTrainer(model, GRPOConfig(lr=1e-2))
    m = trainer.step(samples, advantages_ready=True)
    after = per_sample_mean(token_logprobs(model, b)[0], b).detach()
    pos = [i for i, s in enumerate(samples) if s.advantage > 0]
    neg = [i for i, s in enumerate(samples) if s.advantage < 0]
    assert all(after[i] > before[i] for i in pos) and all(after[i] < before[i] for i in neg)
    assert trainer.step_count == 1 and m["grad_norm"] > 0


def test_grpo_trainer_counts_skips_and_resumes(tiny, tmp_path):
    model, tok = fresh(tiny)
    flat = [TurnSample([5, 6], [7, 8, 9], reward=r, group_id=g, trajectory_id=f"{g}{i}")
            for g, rs in (("x", [1.0, 0.0]), ("y", [0.0, 0.0])) for i, r in enumerate(rs)]
    cfg = GRPOConfig(lr=1e-3, loss_agg="seq-mean")
    trainer = GRPOTrainer(model, cfg, tokenizer=tok)
    m = trainer.step(flat)
    assert m["skipped_groups"] == 1.0 and m["samples"] == 2.0 and m["reward_mean"] == 0.25
    all_skipped = trainer.step([s for s in flat if s.group_id == "y"])
    assert all_skipped["tokens"] == 0.0 and trainer.step_count == 1
    path = trainer.save(tmp_path / "grpo-1")
    nxt = trainer.step(flat)
    other = GRPOTrainer(fresh(tiny)[0], cfg, tokenizer=tok)
    assert other.resume(path) == 1
    again = other.step(flat)
    assert again["loss"] == pytest.approx(nxt["loss"], abs=1e-6)


# -- MLflow and the bench ------------------------------------------------------------------------------

def test_log_checkpoint_registers_version_with_alias(tiny, tmp_path):
    import mlflow

    model, tok = tiny
    path = save_checkpoint(tmp_path / "step-1", model, tok, step=1)
    before_env = os.environ.get("MLFLOW_TRACKING_URI")
    before_uri = mlflow.get_tracking_uri()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    try:
        mlflow.set_tracking_uri(uri)
        exp = mlflow.create_experiment("train-test", artifact_location=(tmp_path / "artifacts").as_uri())
        with mlflow.start_run(experiment_id=exp):
            v1 = log_checkpoint(path, {"eval_loss": 2.0}, "tiny-policy", is_best=True, step=1)
            v2 = log_checkpoint(path, {"eval_loss": 3.0}, "tiny-policy", is_best=False, artifact_path="ck/2")
        client = mlflow.MlflowClient(uri)
        assert (int(v1.version), int(v2.version)) == (1, 2)
        best = client.get_model_version_by_alias("tiny-policy", "best")
        assert best.version == v1.version
        local = mlflow.artifacts.download_artifacts(best.source, dst_path=str(tmp_path / "dl"))
        assert (Path(local) / "model.safetensors").is_file()
    finally:
        mlflow.set_tracking_uri(before_uri)
        if before_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before_env


def test_bench_smoke_prints_json():
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "train_gpu.py"), "--smoke"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert {"flops_formula", "peak_flops", "results"} <= set(doc)
    for mode in ("baseline", "sft", "grpo"):
        r = doc["results"][mode]
        assert {"tokens_per_s", "step_time_s", "peak_memory_bytes", "mfu"} <= set(r)
        assert r["tokens_per_s"] > 0
    assert doc["results"]["sft"]["loss"] == pytest.approx(doc["results"]["baseline"]["loss"], rel=1e-4)


def test_grpo_defaults_are_the_training_configs():
    """One default per training setting: GRPORounds and GRPOConfig built without a TrainingConfig train as
    the default TrainingConfig does (the CLI, Dagster and the demo go through it)."""
    from envforge.train.config import TrainingConfig
    from envforge.train.grpo import GRPOConfig
    from envforge.train.loop import GRPORounds

    assert GRPORounds() == GRPORounds.from_training(TrainingConfig(), pad_id=0)
    assert GRPOConfig() == GRPOConfig.from_training(TrainingConfig(), pad_id=0)
    assert (GRPORounds().rounds, GRPOConfig().lr) == (TrainingConfig().rl_rounds, TrainingConfig().rl_lr)


def test_round_items_samples_a_seeded_batch_per_round():
    from envforge.train.loop import GRPORounds, round_items

    items = [(f"task-{i}", "image") for i in range(10)]
    assert round_items(items, GRPORounds(tasks_per_round=None), 0) == items  # no cap: every task every round
    cfg = GRPORounds(tasks_per_round=4, seed=7)
    first, second = round_items(items, cfg, 0), round_items(items, cfg, 1)
    assert len(first) == len(second) == 4 and len(set(first)) == 4 and set(first) <= set(items)
    assert first == round_items(items, cfg, 0) and first != second  # reproducible, and rounds differ
    assert round_items(items, GRPORounds(tasks_per_round=50), 0) == items


def test_one_training_config_sets_sft_grpo_and_evaluation():
    """The base model, temperature and token budget are defined once: GRPO samples at the temperature its loss
    takes behaviour log-probs at, and 0 tasks per round means every task."""
    from dataclasses import fields

    from envforge.train.config import TrainingConfig
    from envforge.train.loop import GRPORounds

    cfg = TrainingConfig(temperature=0.7, max_tokens=32, tasks_per_round=0, seed=3)
    rounds = GRPORounds.from_training(cfg, pad_id=5)
    assert rounds.grpo.temperature == 0.7 and "temperature" not in {f.name for f in fields(GRPORounds)}
    assert rounds.max_tokens == 32 and rounds.tasks_per_round is None and rounds.seed == rounds.grpo.seed == 3
    sft = cfg.sft_config(pad_id=5)
    assert (sft.epochs, sft.lr, sft.seed, sft.pad_id) == (5, 3e-3, 3, 5)
    assert all(f.metadata.get("help") for f in fields(TrainingConfig))


# -- GRPO hardening (off-policy batches) ---------------------------------------------------------------

def test_log_ratio_is_clamped_before_exp(tiny):
    """Behaviour log-probs far below the model's (a very stale sample) would overflow exp: the clamp keeps the
    loss, its gradient and the ratio finite."""
    model, _ = fresh(tiny)
    samples, _ = group_advantages(_rl_groups())
    stale = _with_behaviour(model, samples, shift=-500.0)
    m = grpo_update(model, None, build_optimizer(model, lr=0.0, weight_decay=0.0), None, stale,
                    GRPOConfig(lr=0.0, log_ratio_clamp=20.0))
    assert all(torch.isfinite(torch.tensor([m["loss"], m["grad_norm"], m["ratio_mean"]])))
    assert m["ratio_mean"] == pytest.approx(float(torch.exp(torch.tensor(20.0))), rel=1e-3)
    unclamped = grpo_update(model, None, build_optimizer(model, lr=0.0, weight_decay=0.0), None, stale,
                            GRPOConfig(lr=0.0, log_ratio_clamp=float("inf")))
    assert not torch.isfinite(torch.tensor(unclamped["ratio_mean"]))  # what the clamp prevents


def test_truncated_completions_are_masked_penalized_or_kept(tiny):
    from dataclasses import replace

    from envforge.train.grpo import handle_truncated

    model, _ = fresh(tiny)
    samples, _ = group_advantages(_rl_groups())
    samples = _with_behaviour(model, samples)
    cut = [replace(s, truncated=i == 0) for i, s in enumerate(samples)]
    assert cut[0].advantage > 0
    masked = grpo_update(copy.deepcopy(model), None, build_optimizer(model, lr=0.0, weight_decay=0.0), None, cut,
                         GRPOConfig(lr=0.0, truncated="mask"))
    kept = grpo_update(copy.deepcopy(model), None, build_optimizer(model, lr=0.0, weight_decay=0.0), None, cut,
                       GRPOConfig(lr=0.0, truncated="keep"))
    assert masked["truncated_samples"] == kept["truncated_samples"] == 1.0
    assert masked["tokens"] == kept["tokens"] - len(cut[0].completion_ids)
    penalized = handle_truncated(cut, GRPOConfig(truncated="penalize", overlong_penalty=0.5))
    assert penalized[0].advantage == -0.5 and [s.advantage for s in penalized[1:]] == [s.advantage for s in cut[1:]]
    with pytest.raises(ValueError, match="truncated must be"):
        handle_truncated(cut, GRPOConfig(truncated="drop"))


def test_truncated_flag_comes_from_the_turns_finish_reason():
    from envforge.rollout.trajectory import Trajectory, Turn
    from envforge.train.data import turn_samples

    turns = [Turn(i, "", [], None, None, "", None, 0.0, 0.0, [1, 2], [3, 4], [-0.1, -0.2], finish_reason=reason)
             for i, reason in enumerate(("stop", "length"))]
    traj = Trajectory("b", "t", "h", "", "p", 0, 0, 0, "", turns=turns)
    assert [s.truncated for s in turn_samples([traj])] == [False, True]


def test_off_policy_refuses_samples_without_behaviour_logprobs(tiny):
    model, _ = fresh(tiny)
    samples, _ = group_advantages(_rl_groups())
    with pytest.raises(ValueError, match="off-policy GRPO needs behaviour log-probs"):
        grpo_update(model, None, build_optimizer(model, lr=0.0, weight_decay=0.0), None, samples, GRPOConfig(off_policy=True))
    on_policy = grpo_update(model, None, build_optimizer(model, lr=0.0, weight_decay=0.0), None, samples, GRPOConfig())
    assert on_policy["ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # on-policy mode still takes them as current


def test_training_config_rejects_bad_values_and_drives_off_policy():
    from envforge.train.config import TrainingConfig
    from envforge.train.loop import GRPORounds

    with pytest.raises(ValueError, match="max_staleness=-1"):
        TrainingConfig(max_staleness=-1)
    with pytest.raises(ValueError, match="truncated='cut'"):
        TrainingConfig(truncated="cut")
    with pytest.raises(ValueError, match="rl_epochs_per_batch=0"):
        TrainingConfig(rl_epochs_per_batch=0)
    assert GRPORounds.from_training(TrainingConfig(rl_epochs_per_batch=3), pad_id=0).grpo.epochs_per_batch == 3
    rounds = GRPORounds.from_training(TrainingConfig(max_staleness=2, kl_coef=0.01, truncated="penalize"), pad_id=0)
    assert rounds.max_staleness == 2 and rounds.grpo.off_policy and rounds.grpo.kl_coef == 0.01
    assert rounds.grpo.truncated == "penalize"
    assert not GRPORounds.from_training(TrainingConfig(), pad_id=0).grpo.off_policy


# -- asynchronous schedule and the one training configuration --------------------------------------------

def test_policy_versions_gate_rounds_on_the_rollout_policy_not_the_trainer():
    """Round r waits until the rollout policy (not the trainer) is at r - max_staleness: with saves and
    reloads off the trainer's path the trainer can be ahead of the policy, and gating on the trainer would
    let a round sample from a policy more than max_staleness behind the update that trains on it."""
    import asyncio

    from envforge.train.loop import PolicyVersions

    async def go() -> list[str]:
        v = PolicyVersions(max_staleness=1, synchronous=False)
        events: list[str] = []

        async def producer() -> None:
            for r in range(3):
                await v.wait_for_round(r)
                events.append(f"round {r} (policy {v.policy}, trainer {v.trainer})")

        task = asyncio.create_task(producer())
        await asyncio.sleep(0.01)
        assert events == ["round 0 (policy 0, trainer 0)", "round 1 (policy 0, trainer 0)"]
        await v.trainer_updated()
        await v.trainer_updated()
        await asyncio.sleep(0.01)
        assert len(events) == 2  # the trainer is at 2 but the policy still at 0: round 2 waits
        await v.policy_loaded(1)
        await task
        return events

    assert asyncio.run(go())[-1] == "round 2 (policy 1, trainer 2)"

    async def sync() -> tuple[int, int]:
        v = PolicyVersions(max_staleness=0, synchronous=True)
        await v.wait_for_round(0)
        waiting = asyncio.create_task(v.wait_for_round(1))
        await asyncio.sleep(0.01)
        assert not waiting.done()  # synchronous: round 1 waits for update 0
        await v.trainer_updated()
        await waiting
        return v.trainer, v.policy

    assert asyncio.run(sync()) == (1, 1)


def test_training_config_reaches_the_async_loop_dagster_and_mlflow():
    """The rollout policy and thread budgets are TrainingConfig fields (so `envforge train rl` options and the
    Dagster `training` resource), carried into GRPORounds; MLflow params are the whole config."""
    from dataclasses import fields

    from assets.defs.config import TrainingResource, training_config
    from envforge.train.config import TrainingConfig
    from envforge.train.loop import GRPORounds

    cfg = TrainingConfig(max_staleness=1, rollout_policy="served", policy_threads=1, trainer_threads=1)
    rounds = GRPORounds.from_training(cfg, pad_id=0)
    assert (rounds.rollout_policy, rounds.policy_threads, rounds.trainer_threads) == ("served", 1, 1)
    assert set(cfg.as_params()) == {f.name for f in fields(TrainingConfig)}
    assert set(TrainingResource.model_fields) == {f.name for f in fields(TrainingConfig)}
    assert training_config(TrainingResource(rollout_policy="served", max_staleness=2)) == TrainingConfig(
        rollout_policy="served", max_staleness=2)
    with pytest.raises(ValueError, match="rollout_policy='vllm'"):
        TrainingConfig(rollout_policy="vllm")


def test_weights_snapshot_saves_what_the_model_was_when_taken(tmp_path):
    """The publisher saves a snapshot while the trainer goes on: later changes to the model do not leak into
    it, tied embeddings stay tied, and the checkpoint loads back to the snapshot's weights."""
    import torch

    from envforge.train.checkpoint import save_checkpoint, weights_snapshot
    from envforge.train.loop import load_model

    model, tok = load_model("tiny:64x2", 0)
    snap = weights_snapshot(model)
    before = {k: v.clone() for k, v in snap.items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    path = save_checkpoint(tmp_path / "snap", model, tok, state_dict=snap)
    loaded, _ = load_model(str(path))
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_demonstration_samples_do_not_depend_on_the_order_rollouts_finished_in():
    """SFT's data order is a seeded permutation of `turn_samples`' list: the list must be the same whichever
    sandbox finished first, or one seed gives different checkpoints run to run."""
    import random

    from envforge.rollout.trajectory import Trajectory, Turn
    from envforge.train.data import turn_samples

    def traj(task: str, index: int) -> Trajectory:
        turn = Turn(0, "", [], None, None, "", None, 0.0, 0.0, [1, len(task)], [3, index], None)
        return Trajectory("b", task, "h", "", "p", 0, index, 0, "", turns=[turn], resolved=True)

    finished = [traj(task, i) for task in ("t-a", "t-b", "t-c") for i in range(3)]
    canonical = [s.trajectory_id for s in turn_samples(finished)]
    for seed in range(5):
        shuffled = finished[:]
        random.Random(seed).shuffle(shuffled)
        assert [s.trajectory_id for s in turn_samples(shuffled)] == canonical
