"""The one training configuration: what SFT, GRPO and the evaluation of a task set read.

TRL-style: one dataclass whose fields carry their help text, so the same object serves
Python, the CLI and the Dagster run config (the `training` resource), and MLflow params.
The base model, the sampling temperature and the token budget are defined here once, so the
evaluation's "before" phase cannot use another base model than SFT started from, and the
temperature GRPO samples at is the temperature its behaviour log-probs are taken at.
Importing this module does not import torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from envforge.train.sft import SFTConfig


ROLLOUT_POLICIES = ("in-process", "served")  # where asynchronous rollouts sample (train.loop)


@dataclass(frozen=True)
class TrainingConfig:
    base_model: str = field(
        default="tiny",
        metadata={"help": "tiny, tiny:<hidden>x<layers>, or a local Hugging Face directory (nothing is downloaded)"},
    )
    seed: int = field(default=0, metadata={"help": "seeds model init, data order, rollouts and the task sample"})
    temperature: float = field(
        default=1.0,
        metadata={
            "help": "GRPO sampling temperature (behaviour log-probs are of logits / T); evaluation decodes greedily"
        },
    )
    max_tokens: int = field(default=64, metadata={"help": "completion tokens per turn in GRPO and evaluation rollouts"})
    concurrency: int = field(
        default=4, metadata={"help": "trajectories at once (demonstrations, GRPO rounds, evaluation)"}
    )
    sft_epochs: int = field(default=5, metadata={"help": "SFT passes over the teacher's demonstrations"})
    sft_lr: float = field(default=3e-3, metadata={"help": "SFT learning rate"})
    rl_rounds: int = field(
        default=2, metadata={"help": "GRPO rounds (rollouts of the current weights, then an update)"}
    )
    group_size: int = field(default=4, metadata={"help": "rollouts per task per GRPO round"})
    tasks_per_round: int = field(
        default=4, metadata={"help": "train-split tasks sampled (seeded) per GRPO round; 0: every task every round"}
    )
    rl_lr: float = field(default=1e-4, metadata={"help": "GRPO learning rate"})
    rl_epochs_per_batch: int = field(
        default=1,
        metadata={
            "help": "GRPO optimizer steps per rollout batch (PPO "
            "epochs; the clip range bounds how far they move "
            "from the policy that sampled it)"
        },
    )
    clip_eps: float = field(default=0.2, metadata={"help": "GRPO lower clip: ratio >= 1 - clip_eps"})
    clip_eps_high: float = field(default=0.28, metadata={"help": "GRPO upper clip: ratio <= 1 + clip_eps_high"})
    loss_agg: str = field(default="token-mean", metadata={"help": "GRPO loss aggregation: token-mean | seq-mean"})
    kl_coef: float = field(
        default=0.0,
        metadata={"help": "GRPO weight of the k3 KL to the starting checkpoint (0: no reference model is kept)"},
    )
    truncated: str = field(
        default="mask",
        metadata={"help": "GRPO completions that hit max_tokens: mask (DAPO overlong filtering) | penalize | keep"},
    )
    max_staleness: int = field(
        default=0,
        metadata={
            "help": "policy versions a rollout may lag the trainer: 0 "
            "synchronous; >0 rollouts of the next rounds run while "
            "the trainer updates (asynchronous)"
        },
    )
    rollout_policy: str = field(
        default="in-process",
        metadata={
            "help": "asynchronous rollouts sample from: in-process (a copy of the weights in the trainer's process, "
            "reloaded per update) | served (an `envforge policy serve` process the loop starts on the start "
            "weights and reloads through /v1/reload: its own interpreter and torch threads)"
        },
    )
    policy_threads: int = field(
        default=0,
        metadata={
            "help": "torch threads of the served policy process; with "
            "trainer_threads also 0, the cores are split: half "
            "(at least 1) to the policy, the rest to the trainer"
        },
    )
    trainer_threads: int = field(
        default=0,
        metadata={
            "help": "torch threads of the trainer's process during GRPO (0: unchanged, or the served split above)"
        },
    )

    def sft_config(self, pad_id: int) -> "SFTConfig":
        from envforge.train.sft import SFTConfig

        return SFTConfig(lr=self.sft_lr, epochs=self.sft_epochs, seed=self.seed, eval_every=20, pad_id=pad_id)

    def __post_init__(self) -> None:
        checks = {
            "temperature": self.temperature > 0,
            "max_tokens": self.max_tokens > 0,
            "group_size": self.group_size >= 2,
            "rl_epochs_per_batch": self.rl_epochs_per_batch >= 1,
            "max_staleness": self.max_staleness >= 0,
            "kl_coef": self.kl_coef >= 0,
            "loss_agg": self.loss_agg in ("token-mean", "seq-mean"),
            "truncated": self.truncated in ("mask", "penalize", "keep"),
            "rollout_policy": self.rollout_policy in ROLLOUT_POLICIES,
            "policy_threads": self.policy_threads >= 0,
            "trainer_threads": self.trainer_threads >= 0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(
                "TrainingConfig: invalid " + ", ".join(f"{n}={getattr(self, n)!r} ({_HELP[n]})" for n in bad)
            )

    def as_params(self) -> dict[str, Any]:
        return asdict(self)


_HELP = {f.name: f.metadata.get("help", "") for f in fields(TrainingConfig)}

# Every training setting's one default: GRPOConfig and GRPORounds, which a Python caller may build
# without a TrainingConfig, take their defaults from here (`GRPORounds.from_training` builds both from one).
TRAINING_DEFAULTS = TrainingConfig()

# The learning demo's training (demos/learning.py, `envforge train demo`): a model small enough to learn
# the chores on CPU in minutes, many SFT epochs over few demonstrations,
# a short GRPO schedule on sampled training tasks, short completions.
# T=0.6: at T=1 the tiny model's tail (blended, malformed commands) buries the slip choice GRPO can fix
# (docs/training.md, the learning demo's diagnosis); the sampled pass@1 is measured at this temperature too.
DEMO_TRAINING = TrainingConfig(
    base_model="tiny:128x4",
    sft_epochs=16,
    sft_lr=3e-3,
    rl_rounds=10,
    tasks_per_round=4,
    group_size=8,
    rl_lr=5e-4,
    max_tokens=48,
    temperature=0.6,
)
