"""Dagster run config generated from the library's config dataclasses: one definition per setting.

`run_config(LibraryConfig)` is a `dg.Config` with the dataclass's fields, defaults and help text
(shown in the launchpad); `to_library(config, LibraryConfig)` builds the library object back.
The training settings are one resource (`training`) rather than per-asset config, so SFT, GRPO
and the evaluation of a run cannot be configured with two different base models or temperatures.
"""

from __future__ import annotations

import typing
from dataclasses import MISSING, Field, fields
from typing import Any, TypeVar

import dagster as dg
import pydantic

from envforge.train.config import TrainingConfig

T = TypeVar("T")


def _default(f: Field) -> Any:
    return f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]


def _fields(*classes: type, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            if f.name in skip:
                continue
            if f.name in out:
                raise TypeError(f"run config field {f.name} is defined by two configs")
            out[f.name] = (hints[f.name], pydantic.Field(default=_default(f), description=f.metadata.get("help") or None))
    return out


def run_config(classes: type | tuple[type, ...], name: str, doc: str | None = None, skip: tuple[str, ...] = (),
               **extra: tuple[type, Any]) -> type[dg.Config]:
    """A run-config class with the fields of the library config(s) (but `skip`), plus `extra` fields given as
    (type, pydantic.Field) for settings that only the asset has."""
    classes = classes if isinstance(classes, tuple) else (classes,)
    return pydantic.create_model(name, __base__=dg.Config, __doc__=doc or classes[0].__doc__, __module__=__name__,
                                 **_fields(*classes, skip=skip), **extra)


def to_library(config: pydantic.BaseModel, cls: type[T], **overrides: Any) -> T:
    """The library config a run config (or resource) stands for."""
    values = {f.name: getattr(config, f.name) for f in fields(cls) if hasattr(config, f.name)}
    return cls(**{**values, **overrides})


TrainingResource = pydantic.create_model(
    "TrainingResource", __base__=dg.ConfigurableResource, __module__=__name__, **_fields(TrainingConfig),
    __doc__="How the run trains and evaluates (envforge.train.config.TrainingConfig): read by sft_checkpoint, "
            "rl_checkpoint and evaluation_report alike. Set it under resources.training.config.")


def training_config(resource: Any) -> TrainingConfig:
    return to_library(resource, TrainingConfig)
