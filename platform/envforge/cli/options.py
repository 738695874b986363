"""Config dataclasses as command options: one definition of a setting serves Python, the CLI, the
Dagster run config and MLflow params.

`@config_options` replaces every parameter of a command annotated with a config dataclass by one
`--option` per field (help from the field's `help` metadata, flags from its `cli` metadata, default
from the field), and calls the command with the built config object. A field that is itself a
config dataclass contributes its fields prefixed with its name (`semantic.url` is `--semantic-url`);
a field with `option: False` metadata is set in code, not on the command line; `tuple[X, ...]`
fields are repeatable options. The options' defaults are the fields' values in the parameter's default
(`config: TrainingConfig = DEMO_TRAINING` defaults every option to the demo's setting), or the
fields' own defaults when the parameter has none. A parameter annotated `Config | None` (default None) gets options
that default to None: none given, the command gets None; some given, a config with those fields
set and the rest at their defaults.
"""

from __future__ import annotations

import functools
import inspect
import typing
from dataclasses import MISSING, Field, dataclass, fields, is_dataclass, replace
from typing import Any, Callable, List, Optional

import typer

from envforge.config import config_from_dict


def _default(f: Field) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    raise TypeError(f"config field {f.name} needs a default to be a command option")


def _annotation(tp: Any) -> Any:
    """`X | None` as typing.Optional[X] and `tuple[X, ...]` as List[X], which every typer version reads."""
    args = typing.get_args(tp)
    if type(None) in args and len(args) == 2:
        return Optional[_annotation(next(a for a in args if a is not type(None)))]
    if typing.get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis:
        return List[args[0]]
    return tp


def _optional_dataclass(tp: Any) -> type | None:
    args = typing.get_args(tp)
    if type(None) in args and len(args) == 2:
        inner = next(a for a in args if a is not type(None))
        return inner if is_dataclass(inner) else None
    return None


@dataclass(frozen=True)
class ConfigOption:
    """One option of a config: its parameter name and the field it sets (`path`: through nested configs)."""

    name: str
    path: tuple[str, ...]
    owner: type
    field: Field


def config_fields(cls: type, prefix: str = "") -> list[ConfigOption]:
    """The options a config dataclass becomes, nested configs flattened (see the module docstring)."""
    hints = typing.get_type_hints(cls)
    out: list[ConfigOption] = []
    for f in fields(cls):
        if f.metadata.get("option", True) is False:
            continue
        if is_dataclass(hints[f.name]):
            out += [replace(o, path=(f.name, *o.path)) for o in config_fields(hints[f.name], f"{prefix}{f.name}_")]
        else:
            out.append(ConfigOption(prefix + f.name, (f.name,), cls, f))
    return out


def field_option(cls: type, f: Field, optional: bool = False, default: Any = MISSING) -> tuple[Any, Any]:
    """(annotation, typer.Option) for one config field; `optional`: defaults to None (not given);
    `default`: the option's default instead of the field's."""
    hints = typing.get_type_hints(cls)
    flags = f.metadata.get("cli", ())  # else typer's: from the parameter's name
    annotation, help_text = _annotation(hints[f.name]), f.metadata.get("help", "")
    default = _default(f) if default is MISSING else default
    if isinstance(default, tuple):
        default = list(default)
    if optional:
        annotation = Optional[annotation] if typing.get_origin(annotation) is not typing.Union else annotation
        help_text = f"{help_text} [default: {default}]" if help_text else f"[default: {default}]"
        default = None
    return annotation, typer.Option(default, *flags, help=help_text)


def _value_at(config: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        config = getattr(config, name)
    return config


def build_config(cls: type, values: dict[str, Any], options: list[ConfigOption] | None = None) -> Any:
    """The config object for option values {option name: value} (nested configs built, lists made tuples,
    fields without a value at their defaults)."""
    nested: dict[str, Any] = {}
    for o in options if options is not None else config_fields(cls):
        if o.name in values:
            *parents, leaf = o.path
            target = nested
            for p in parents:
                target = target.setdefault(p, {})
            target[leaf] = values[o.name]
    return config_from_dict(cls, nested)


def config_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Expand the command's config-dataclass parameters into options (see the module docstring)."""
    hints = typing.get_type_hints(command)
    params: list[inspect.Parameter] = []
    configs: dict[str, tuple[type, list[ConfigOption], bool]] = {}
    for name, p in inspect.signature(command).parameters.items():
        tp = hints.get(name, p.annotation)
        optional = _optional_dataclass(tp)
        cls = tp if is_dataclass(tp) else optional
        if cls is not None:
            options = config_fields(cls)
            configs[name] = (cls, options, optional is not None)
            base = p.default if is_dataclass(p.default) and not isinstance(p.default, type) else None
            for o in options:
                annotation, option = field_option(
                    o.owner,
                    o.field,
                    optional=optional is not None,
                    default=_value_at(base, o.path) if base is not None else MISSING,
                )
                params.append(
                    inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)
                )
        else:
            params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=tp))
    names = [p.name for p in params]
    clashes = {n for n in names if names.count(n) > 1}
    if clashes:
        raise TypeError(f"{command.__name__}: options defined twice: {sorted(clashes)}")

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        built = {}
        try:  # a config's own check of its values (__post_init__) is a usage error
            for name, (cls, options, optional) in configs.items():
                values = {o.name: kwargs.pop(o.name) for o in options}
                if optional:
                    values = {k: v for k, v in values.items() if v is not None}
                    built[name] = build_config(cls, values, options) if values else None
                else:
                    built[name] = build_config(cls, values, options)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        return command(**kwargs, **built)

    del wrapper.__wrapped__  # typer must see the expanded signature, not the command's
    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper
