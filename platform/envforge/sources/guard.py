"""The checks every source parser applies to what it reads, as rejects naming the record and field.

- paths a source names resolve inside its folder or the allowed roots (`envforge.safefs`);
- files are regular, under a size cap, UTF-8 (a byte-order mark is accepted);
- YAML is composed first and its size with every alias expanded is bounded (a 1 KB alias bomb
  would otherwise become a 69 MB task), and recursive aliases are refused;
- free text has NUL and control characters (except tab and newlines) stripped, and a length cap;
- commits given as branches or relative refs are resolved to their SHA (or refused);
- a pydantic validation error becomes one reject per field, named as the source writes it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from envforge import safefs
from envforge.errors import Problem, SpecError
from envforge.sources.policy import SourcePolicy

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_HEX_SHA = re.compile(r"^[0-9a-fA-F]{7,64}$")


def reject(where: str, field: str, reason: str) -> SpecError:
    return SpecError([Problem(where, field, reason)])


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "literal"}


def _is_type_tag(part: object) -> bool:
    """Pydantic names the union member it tried in an error's location ('str', 'function-after[...]',
    'ReviewComment'): those are not fields, and a reject names fields."""
    if not isinstance(part, str):
        return False
    return part in _TYPE_TAGS or "[" in part or (part[:1].isupper() and part.isalnum() and not part.isupper())


def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if _is_type_tag(part):
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validation_problems(source: str, err: ValidationError) -> list[Problem]:
    """A pydantic error as one reject per field, named as the source writes it (`a.b[0]`)."""
    problems: list[Problem] = []
    seen: set[str] = set()
    for e in err.errors():
        field = _field_path(e["loc"])
        if field in seen:  # a union reports once per member: the first says enough
            continue
        seen.add(field)
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; see docs/task-spec.md)"
        elif e["type"] == "missing":
            msg = "required field is missing"
        problems.append(Problem(source, field, msg))
    return problems


def confined(base: Path, rel: str, where: str, field: str, policy: SourcePolicy) -> Path:
    """The real path a source names, inside its folder or an allowed root; else a reject."""
    try:
        return safefs.confine(base, rel, policy.roots)
    except safefs.UnsafePath as exc:
        raise reject(where, field, str(exc)) from None


def source_file(path: Path, policy: SourcePolicy) -> Path:
    """The real path of a file that defines a source: a symlink may not lead it out of its folder."""
    path = Path(path)
    return confined(path.parent, path.name, str(path), "", policy)


def read_bytes(path: Path, cap: int, where: str, field: str = "") -> bytes:
    try:
        return safefs.read_regular(path, cap)
    except safefs.UnsafePath as exc:
        raise reject(where, field, str(exc)) from None


def read_text(path: Path, cap: int, where: str, field: str = "") -> str:
    try:
        return safefs.decode_utf8(safefs.read_regular(path, cap), str(path))
    except safefs.UnsafePath as exc:
        raise reject(where, field, str(exc)) from None


def scan_tree(root: Path, where: str, field: str) -> safefs.TreeScan:
    try:
        return safefs.scan_tree(root)
    except safefs.UnsafePath as exc:
        raise reject(where, field, str(exc)) from None


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader; the node graph is measured before anything is constructed."""


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def expanded_size(root: yaml.Node, cap: int) -> int:
    """Nodes in the document with every alias expanded; ValueError past cap or on a recursive alias."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            open_nodes.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in _children(node))
            if sizes[key] > cap:
                raise ValueError(f"with its aliases expanded the document has over {cap} nodes")
            continue
        if key in sizes:
            continue
        open_nodes.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in open_nodes:
                raise ValueError("a recursive alias (a node that contains itself)")
            if id(child) not in sizes:
                stack.append((child, False))
    return sizes[id(root)]


def load_yaml(text: str, where: str, policy: SourcePolicy, field: str = "") -> Any:
    """One YAML document, bounded in size and alias expansion; SpecError naming where it breaks."""
    if len(text.encode("utf-8", "surrogatepass")) > policy.max_yaml_bytes:
        raise reject(where, field, f"the YAML is over the {policy.max_yaml_bytes}-byte limit")
    loader = None
    try:
        loader = _BoundedLoader(text)  # the reader refuses NUL and other non-printable characters here
        node = loader.get_single_node()
        if node is None:
            return None
        expanded_size(node, policy.max_yaml_nodes)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise reject(where, field, f"not valid YAML{at}: {getattr(exc, 'problem', None) or exc}") from None
    except ValueError as exc:
        raise reject(where, field, f"YAML refused: {exc}") from None
    except RecursionError:
        raise reject(where, field, "YAML refused: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml_file(path: Path, where: str, policy: SourcePolicy) -> Any:
    """A source's YAML file (confined, regular, capped, bounded); SpecError naming `where`."""
    return load_yaml(read_text(source_file(path, policy), policy.max_yaml_bytes, where), where, policy)


def clean_text(value: str) -> str:
    """Text without NUL and control characters (tabs and newlines stay)."""
    return _CONTROL.sub("", value)


def check_text(value: str, where: str, field: str, policy: SourcePolicy) -> str:
    """Free text a policy will read: control characters stripped, length capped (a reject past the cap)."""
    value = clean_text(value)
    if len(value) > policy.max_text_chars:
        raise reject(
            where,
            field,
            f"is {len(value)} characters, over the {policy.max_text_chars}-character limit "
            "(max_text_chars in the source policy)",
        )
    return value


def check_footprint(need: int, limits, where: str, field: str) -> None:
    """A workspace that cannot fit its sandbox's /workspace tmpfs (limits.workspace_mb) is a reject."""
    room = limits.workspace_mb * 1024 * 1024
    if need > room:
        raise reject(
            where,
            field,
            f"the workspace needs about {-(-need // (1 << 20))} MiB in the sandbox (its files "
            f"and their git copy, in 4 KiB pages), over workspace_mb {limits.workspace_mb}: "
            "raise limits.workspace_mb (and memory_mb) or shrink the workspace",
        )


def is_sha_prefix(rev: str, sha: str) -> bool:
    return bool(_HEX_SHA.match(rev)) and sha.lower().startswith(rev.lower())


def pinned(rev: str, sha: str, where: str, field: str, policy: SourcePolicy, pins: dict[str, dict[str, str]]) -> str:
    """The SHA a commit-ish resolved to; a moving ref is recorded in `pins` or refused by the policy."""
    if is_sha_prefix(rev, sha):
        return sha
    if policy.moving_refs == "refuse":
        raise reject(
            where,
            field,
            f"{rev!r} is a moving ref (it resolves to {sha[:12]} today); give the commit SHA "
            "(moving_refs: refuse in the source policy)",
        )
    pins[field] = {"ref": rev, "sha": sha}
    return sha


UNEXPECTED = "could not be loaded: unexpected error"


def unexpected(where: str, exc: BaseException) -> Problem:
    """A reject for an exception no check anticipated: the record is lost, never the batch."""
    return Problem(where, "", f"{UNEXPECTED} {type(exc).__name__}: {exc}"[:2000])


__all__ = [
    "check_footprint",
    "check_text",
    "clean_text",
    "confined",
    "expanded_size",
    "is_sha_prefix",
    "load_yaml",
    "load_yaml_file",
    "pinned",
    "read_bytes",
    "read_text",
    "reject",
    "scan_tree",
    "source_file",
    "unexpected",
    "UNEXPECTED",
]
