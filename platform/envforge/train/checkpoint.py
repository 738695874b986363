"""Checkpoints: Hugging Face directories that serve as-is, plus the state to resume training.

A checkpoint directory is what `AutoModelForCausalLM.from_pretrained`, `HFPolicy` and
`vllm serve` load (safetensors, config.json, generation_config.json, tokenizer files with
the chat template), plus `trainer_state.pt` (optimizer, scheduler, step, RNG states) that
only training reads. It is written into a temporary sibling directory and renamed into
place, so a reader (a rollout worker hot-reloading weights, a crashed run resuming) never
sees a half-written checkpoint.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from envforge.hashing import digest_parts

TRAINER_STATE = "trainer_state.pt"


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch (CPU and every CUDA device) RNG states."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    path: str | Path,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    step: int = 0,
    extra: Mapping[str, Any] | None = None,
    state_dict: Mapping[str, torch.Tensor] | None = None,
) -> Path:
    """Write a servable Hugging Face checkpoint (and `trainer_state.pt`) to `path`, atomically.

    An existing directory at `path` is replaced only once the new one is complete. The
    trainer state is written even without an optimizer (step, RNG, extra), so a checkpoint
    always says where it came from. `state_dict` (a `weights_snapshot`) writes those weights
    instead of the model's current ones, so a background thread can save while training goes on."""
    path = Path(path).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True, state_dict=dict(state_dict) if state_dict else None)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        state: dict[str, Any] = {"step": int(step), "rng": rng_state(), "extra": dict(extra or {})}
        if optimizer is not None:
            state["optimizer"] = optimizer.state_dict()
        if scheduler is not None:
            state["scheduler"] = scheduler.state_dict()
        torch.save(state, tmp / TRAINER_STATE)
        if path.exists():
            old = path.with_name(f".{path.name}.old-{tmp.name.rsplit('-', 1)[-1]}")
            path.rename(old)
            tmp.rename(path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def weights_snapshot(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """A CPU copy of the model's weights (tensors shared in the model, tied embeddings, stay shared),
    taken in the training thread between updates so saving can happen elsewhere meanwhile."""
    copies: dict[tuple[int, torch.device], torch.Tensor] = {}
    with torch.no_grad():
        return {
            k: copies.setdefault((v.data_ptr(), v.device), v.detach().to("cpu", copy=True))
            for k, v in model.state_dict().items()
        }


def weights_digest(model: PreTrainedModel) -> str:
    """sha256 over the model's parameter and buffer names, dtypes, shapes and bytes: two models with the
    same digest hold bit-identical weights (a run that says it started from a given checkpoint can show it)."""
    parts: list[str | bytes] = []
    with torch.no_grad():
        for name, tensor in sorted(model.state_dict().items()):
            flat = tensor.detach().to("cpu").contiguous().reshape(-1)
            parts += [name, f"{flat.dtype}:{tuple(tensor.shape)}", flat.view(torch.uint8).numpy().tobytes()]
    return digest_parts(*parts)


def read_trainer_state(path: str | Path) -> dict[str, Any]:
    """The raw `trainer_state.pt` of a checkpoint directory (our own file, so a full unpickle)."""
    return torch.load(Path(path) / TRAINER_STATE, map_location="cpu", weights_only=False)


def load_trainer_state(
    path: str | Path,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    *,
    restore_rng: bool = True,
) -> int:
    """Restore optimizer, scheduler and RNG states from a checkpoint; returns its step.

    Load the weights first (`load_weights`): optimizer state is keyed by parameter order, so
    it belongs to a model of the same architecture built the same way."""
    state = read_trainer_state(path)
    if optimizer is not None and "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and "scheduler" in state:
        scheduler.load_state_dict(state["scheduler"])
    if restore_rng:
        set_rng_state(state["rng"])
    return int(state["step"])


def load_weights(model: PreTrainedModel, path: str | Path) -> None:
    """Copy a checkpoint's safetensors weights into an existing model, in place (keeps the
    parameter objects, so an optimizer built on them stays valid). Tied weights are saved
    once; they are re-tied after loading."""
    from safetensors.torch import load_file

    path = Path(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {path}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    really_missing = [k for k in missing if k not in tied]
    if really_missing or unexpected:
        raise ValueError(f"checkpoint does not match the model: missing {really_missing}, unexpected {unexpected}")
    if hasattr(model, "tie_weights"):
        model.tie_weights()


def log_checkpoint(
    path: str | Path,
    metrics: Mapping[str, float] | None,
    registered_model_name: str,
    *,
    alias: str = "best",
    is_best: bool = False,
    artifact_path: str | None = None,
    step: int | None = None,
    tags: Mapping[str, str] | None = None,
) -> Any:
    """Log a checkpoint directory as artifacts of the active MLflow run and register it.

    The artifacts go under `checkpoints/<dir name>` (or `artifact_path`); a model version of
    `registered_model_name` is created with that artifact location as its source and linked
    to the run; `alias` is moved to it when `is_best`. Registration goes through
    `MlflowClient.create_model_version` on the artifact URI: `mlflow.register_model` with a
    `runs:/` URI needs an MLflow "logged model" in MLflow 3, which a plain Hugging Face
    directory is not, and the flavors (transformers/pyfunc) want to re-save the model. The
    version's source is a directory `from_pretrained` loads directly. The version is tagged
    with `tags` (its lineage: task set, rollout batches, start checkpoint), its metrics, the
    checkpoint's path on disk, and the MLflow and Dagster runs it came from, which is what
    `envforge lineage` walks. Returns the ModelVersion."""
    import mlflow

    from envforge import track

    run = mlflow.active_run()
    if run is None:
        raise RuntimeError("log_checkpoint needs an active MLflow run (use envforge.track.mlflow_run)")
    path = Path(path)
    artifact_path = artifact_path or f"checkpoints/{path.name}"
    mlflow.log_artifacts(str(path), artifact_path=artifact_path)
    if metrics:
        track.log_metrics(metrics, step=step)
    client = mlflow.MlflowClient()
    try:
        client.get_registered_model(registered_model_name)
    except mlflow.exceptions.MlflowException:
        try:
            client.create_registered_model(registered_model_name)
        except mlflow.exceptions.MlflowException:  # created concurrently
            pass
    all_tags = {f"metric.{k}": str(v) for k, v in (metrics or {}).items()}
    all_tags.update({k: str(v) for k, v in (tags or {}).items()})
    all_tags.update(
        {
            "checkpoint_path": str(path.resolve()),
            "mlflow_run_id": run.info.run_id,
            "dagster_run_id": run.data.tags.get(track.DAGSTER_RUN_TAG, ""),
        }
    )
    version = client.create_model_version(
        registered_model_name, source=mlflow.get_artifact_uri(artifact_path), run_id=run.info.run_id, tags=all_tags
    )
    if is_best:
        client.set_registered_model_alias(registered_model_name, alias, version.version)
    return version
