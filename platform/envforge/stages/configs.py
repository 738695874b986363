"""The run configs of the stages that have no domain package of their own.

The others live with their domain: `quality.params.DedupConfig`, `verify.config.GateConfig`,
`rollout.config.RolloutConfig`, `train.config.TrainingConfig`. Every one is a dataclass whose
fields carry their help text, so one definition serves Python, the CLI (`cli.options`), the
Dagster run config (`assets/defs/config.py`) and MLflow params. Importing these modules is cheap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from envforge.quality.statement_config import STATEMENT_POLICIES, StatementReviewConfig


@dataclass(frozen=True)
class IngestConfig:
    strict: bool = field(
        default=False, metadata={"help": "refuse the whole batch if any record is bad (nothing is written)"}
    )
    statements: str = field(
        default="flag",
        metadata={
            "help": "what to do with a task statement that leaks the fix or says too little, after its deterministic "
            "repair: strict (keep the task out, as a reject with the findings), flag (keep it, repaired, with "
            "its verdict), off (no check)"
        },
    )
    review: StatementReviewConfig = field(
        default_factory=StatementReviewConfig, metadata={"help": "the optional model-assisted review of statements"}
    )
    incremental: bool = field(
        default=True,
        metadata={
            "help": "history sources derive only the commits their latest load did not see; the others keep that "
            "load's outcome (task or reject). Off: every commit of the range again (cached derivations)"
        },
    )

    def __post_init__(self) -> None:
        if self.statements not in STATEMENT_POLICIES:
            raise ValueError(
                f"IngestConfig.statements: must be one of {', '.join(STATEMENT_POLICIES)}, got {self.statements!r}"
            )


@dataclass(frozen=True)
class ImagesConfig:
    """Tags are content hashes, so an unchanged recipe or task is a cache hit."""

    rebuild: bool = field(
        default=False,
        metadata={
            "help": "build tasks recorded on another base or env image "
            "on the current ones (otherwise they fail, with why)"
        },
    )


@dataclass(frozen=True)
class TaskSetConfig:
    name: str = field(
        default="main", metadata={"help": "task-set name; a new version's parent is the newest version of this name"}
    )


@dataclass(frozen=True)
class TierConfig:
    policy: str = field(
        default="",
        metadata={"help": "reference policy for pass@k (replay, openai:<url>, hf:<path>, ...); empty: static features"},
    )
    k: int = field(default=8, metadata={"help": "samples per task for pass@k", "cli": ("-k",)})
    eval_fraction: float = field(
        default=0.2,
        metadata={"help": "share of the solvable tasks (whole near-duplicate clusters) held out for evaluation"},
    )
    seed: int = field(default=0, metadata={"help": "seeds the pass@k rollouts and the split"})
    concurrency: int = field(default=4, metadata={"help": "reference-policy trajectories at once"})


@dataclass(frozen=True)
class ReportConfig:
    """The report takes no settings: it shows what the catalog and MLflow hold for its task set."""
