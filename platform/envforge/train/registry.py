"""The model registry's rule for `best`: an alias moves only on evidence from the eval split.

A training stage registers every checkpoint it writes (tagged with its lineage, see
`checkpoint.log_checkpoint`) but never moves `best`. The evaluation stage measures the new
checkpoint's eval-split pass@1 and calls `promote_if_better`: the alias moves to it only if
it beats the checkpoint `best` points at now, on the same eval split. The current best's
score on that split is read from its tag `eval.pass_at_1.<task set>` when an earlier
evaluation wrote it, and measured otherwise (from the registered artifacts, since the
checkpoint directory on disk may have been overwritten by a later run of the same task set).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from envforge import track
from envforge.config import Settings

BEST = "best"


def eval_tag(task_set_version: str) -> str:
    return f"eval.pass_at_1.{task_set_version[:12]}"


def registry_client(settings: Settings) -> Any:
    import mlflow

    track.experiment_id(settings)  # points the client at the configured store
    return mlflow.MlflowClient()


def version_for_checkpoint(settings: Settings, model_name: str, checkpoint: str | Path) -> Any | None:
    """The newest registered version of `model_name` made from the checkpoint directory `checkpoint`."""
    client = registry_client(settings)
    path = str(Path(checkpoint).resolve()).replace("'", "\\'")
    found = client.search_model_versions(f"name = '{model_name}' and tags.checkpoint_path = '{path}'")
    return max(found, key=lambda v: int(v.version)) if found else None


def aliased_version(settings: Settings, model_name: str, alias: str = BEST) -> Any | None:
    import mlflow

    try:
        return registry_client(settings).get_model_version_by_alias(model_name, alias)
    except mlflow.exceptions.MlflowException:
        return None


def local_copy(version: Any) -> str:
    """A directory holding the registered version's checkpoint (its artifacts)."""
    import mlflow

    return mlflow.artifacts.download_artifacts(artifact_uri=version.source)


def promote_if_better(
    settings: Settings,
    model_name: str,
    checkpoint: str | Path,
    score: float,
    task_set_version: str,
    measure: Callable[[str], float],
    alias: str = BEST,
) -> dict[str, Any]:
    """Tag the checkpoint's registered version with its eval-split `score`, and move `alias` to it if
    it beats the current holder's score on the same split (`measure(checkpoint_dir)` gives that score
    when the holder has no tag for this split). Returns the decision, for the evaluation report."""
    client = registry_client(settings)
    candidate = version_for_checkpoint(settings, model_name, checkpoint)
    if candidate is None:
        return {"promoted": False, "reason": f"{checkpoint} is not a registered version of {model_name}"}
    tag = eval_tag(task_set_version)
    client.set_model_version_tag(model_name, candidate.version, tag, str(score))
    current = aliased_version(settings, model_name, alias)
    decision: dict[str, Any] = {
        "model": model_name,
        "candidate_version": str(candidate.version),
        "candidate_score": score,
        "task_set_version": task_set_version,
        "alias": alias,
    }
    if current is not None and str(current.version) != str(candidate.version):
        if tag in current.tags:
            best_score = float(current.tags[tag])
        else:
            best_score = float(measure(local_copy(current)))
            client.set_model_version_tag(model_name, current.version, tag, str(best_score))
        decision.update(previous_version=str(current.version), previous_score=best_score)
        if score <= best_score:
            client.set_model_version_tag(model_name, candidate.version, "promoted", "false")
            return {
                **decision,
                "promoted": False,
                "reason": f"eval-split pass@1 {score:.3f} does not beat {alias} (v{current.version}) {best_score:.3f}",
            }
    client.set_registered_model_alias(model_name, alias, candidate.version)
    client.set_model_version_tag(model_name, candidate.version, "promoted", "true")
    return {
        **decision,
        "promoted": True,
        "reason": "no current holder" if current is None else "beats the current holder",
    }
