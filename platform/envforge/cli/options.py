"""Config dataclasses as command options: one definition of a setting serves Python, the CLI, the
Dagster run config and MLflow params.

`@config_options` replaces every parameter of a command annotated with a config dataclass by one
`--option` per field (help from the field's `help` metadata, flags from its `cli` metadata, default
from the field), and calls the command with the built config object.
"""

from __future__ import annotations

import functools
import inspect
import typing
from dataclasses import MISSING, Field, fields, is_dataclass
from typing import Any, Callable, Optional

import typer


def _default(f: Field) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    raise TypeError(f"config field {f.name} needs a default to be a command option")


def _annotation(tp: Any) -> Any:
    """`X | None` as typing.Optional[X], which every typer version reads."""
    args = typing.get_args(tp)
    if type(None) in args and len(args) == 2:
        return Optional[next(a for a in args if a is not type(None))]
    return tp


def field_option(cls: type, f: Field) -> tuple[Any, Any]:
    """(annotation, typer.Option) for one config field."""
    hints = typing.get_type_hints(cls)
    flags = f.metadata.get("cli", ())
    return _annotation(hints[f.name]), typer.Option(_default(f), *flags, help=f.metadata.get("help", ""))


def config_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Expand the command's config-dataclass parameters into options (see the module docstring)."""
    hints = typing.get_type_hints(command)
    params: list[inspect.Parameter] = []
    configs: dict[str, type] = {}
    for name, p in inspect.signature(command).parameters.items():
        tp = hints.get(name, p.annotation)
        if is_dataclass(tp):
            configs[name] = tp
            for f in fields(tp):
                annotation, option = field_option(tp, f)
                params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=option,
                                                annotation=annotation))
        else:
            params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=tp))
    names = [p.name for p in params]
    clashes = {n for n in names if names.count(n) > 1}
    if clashes:
        raise TypeError(f"{command.__name__}: options defined twice: {sorted(clashes)}")

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        try:
            built = {name: cls(**{f.name: kwargs.pop(f.name) for f in fields(cls)}) for name, cls in configs.items()}
        except ValueError as exc:  # a config's own check of its values: a usage error, not a crash
            raise typer.BadParameter(str(exc)) from exc
        return command(**kwargs, **built)

    del wrapper.__wrapped__  # typer must see the expanded signature, not the command's
    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper
