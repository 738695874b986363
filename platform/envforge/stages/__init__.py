"""The pipeline's stages, one module each: a plain function that does the work and returns a typed
result, and the one tracked form (`fn.tracked(...)`) that records any stage in MLflow the same way.

| module | stage function | config | result |
|---|---|---|---|
| ingest | `ingest(settings, config, paths)` | `IngestConfig` | `IngestResult` |
| decontaminate | `decontaminate(settings, config, tasks)` | `quality.params.DedupConfig` | `DecontaminationResult` |
| images | `build_images(settings, config, tasks)` | `ImagesConfig` | `ImagesResult` (its `ImageSet`) |
| gate | `gate(settings, config, tasks, images)` | `verify.gate.GateConfig` | `GateResult` |
| task_set | `publish_task_set(settings, config, tasks, lineage)` | `TaskSetConfig` | `TaskSetResult` |
| tiers | `tier_task_set(settings, config, version)` | `TierConfig` | `TiersResult` |
| rollout | `rollout(settings, config, tasks, policy)` | `rollout.scheduler.RolloutConfig` | `RolloutResult` |
| sft | `sft(settings, config, version)` | `train.config.TrainingConfig` | `SFTStageResult` |
| rl | `rl(settings, config, version, start)` | `train.config.TrainingConfig` | `RLStageResult` |
| evaluate | `evaluate(settings, config, version, checkpoints)` | `train.config.TrainingConfig` | `EvaluationResult` |
| report | `report(settings, config, version)` | `ReportConfig` | `ReportResult` |

Versions travel explicitly: a stage that works on a task set takes its full version, and the
stages after `images` take the run's `ImageSet` (without one they build what they need, cache
hits). The CLI, the Dagster assets and the demo call only these. docs/architecture.md has the flow.
Importing this package is cheap: heavy libraries (torch, transformers) load when a stage runs.
"""

from envforge.stages.base import CheckpointRecord, Stage, StageContext, StageResult, stage

__all__ = ["CheckpointRecord", "Stage", "StageContext", "StageResult", "stage"]
