"""Dagster run config generated from the library's config dataclasses: one definition per setting.

`run_config(LibraryConfig)` is a `dg.Config` with the dataclass's fields, defaults and help text
(shown in the launchpad); `to_library(config, LibraryConfig)` builds the library object back.
The training settings are one resource (`training`) rather than per-asset config, so SFT, GRPO
and the evaluation of a run cannot be configured with two different base models or temperatures.
"""

from __future__ import annotations

import typing
from dataclasses import MISSING, Field, fields, is_dataclass
from typing import Any, TypeVar

import dagster as dg
import pydantic

from envforge.config import config_from_dict
from envforge.train.config import TrainingConfig

T = TypeVar("T")


def _default(f: Field) -> Any:
    return f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]


def _fields(*classes: type, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """pydantic fields for the dataclasses' fields: a nested config dataclass becomes a nested run-config
    class, `tuple[X, ...]` a list, and a field with `option: False` metadata (set in code) is left out."""
    out: dict[str, Any] = {}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            if f.name in skip or f.metadata.get("option", True) is False:
                continue
            if f.name in out:
                raise TypeError(f"run config field {f.name} is defined by two configs")
            tp, default = hints[f.name], _default(f)
            if is_dataclass(tp):
                tp = run_config(tp, f"{tp.__name__}RunConfig")
                default = tp(**_values(default))
            elif typing.get_origin(tp) is tuple:
                tp, default = list[typing.get_args(tp)[0]], list(default)
            out[f.name] = (tp, pydantic.Field(default=default, description=f.metadata.get("help") or None))
    return out


def _values(obj: Any) -> dict[str, Any]:
    """A dataclass's run-config values (nested ones as dicts, tuples as lists)."""
    return {f.name: (_values(v) if is_dataclass(v) else list(v) if isinstance(v, tuple) else v)
            for f in fields(obj) if f.metadata.get("option", True) is not False for v in [getattr(obj, f.name)]}


def run_config(classes: type | tuple[type, ...], name: str, doc: str | None = None, skip: tuple[str, ...] = (),
               **extra: tuple[type, Any]) -> type[dg.Config]:
    """A run-config class with the fields of the library config(s) (but `skip`), plus `extra` fields given as
    (type, pydantic.Field) for settings that only the asset has."""
    classes = classes if isinstance(classes, tuple) else (classes,)
    return pydantic.create_model(name, __base__=dg.Config, __doc__=doc or classes[0].__doc__, __module__=__name__,
                                 **_fields(*classes, skip=skip), **extra)


def to_library(config: pydantic.BaseModel, cls: type[T], **overrides: Any) -> T:
    """The library config a run config (or resource) stands for (nested configs built, lists made tuples)."""
    values = {f.name: getattr(config, f.name) for f in fields(cls) if hasattr(config, f.name)}
    values = {k: v.model_dump() if isinstance(v, pydantic.BaseModel) else v for k, v in values.items()}
    return config_from_dict(cls, {**values, **overrides})


TrainingResource = pydantic.create_model(
    "TrainingResource", __base__=dg.ConfigurableResource, __module__=__name__, **_fields(TrainingConfig),
    __doc__="How the run trains and evaluates (envforge.train.config.TrainingConfig): read by sft_checkpoint, "
            "rl_checkpoint and evaluation_report alike. Set it under resources.training.config.")


def training_config(resource: Any) -> TrainingConfig:
    return to_library(resource, TrainingConfig)
