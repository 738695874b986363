"""Field types shared by the record and config models of every source.

Records come from other teams' exports, so types are checked before anything is used:
a list where a string belongs, a number where a patch belongs, a name with a newline in it
are all rejects naming the field, never a TypeError later.
"""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, StrictInt, StrictStr

MAX_NAME_CHARS = 200


def _name(value: str | int) -> str:
    text = str(value)
    if not text or len(text) > MAX_NAME_CHARS or any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in text):
        raise ValueError(f"must be a name of 1-{MAX_NAME_CHARS} characters without whitespace or control characters")
    return text


def _ref(value: str) -> str:
    _name(value)
    if value.startswith("-"):
        raise ValueError("a commit may not start with '-'")
    return value


# A name or id (a number is taken as its decimal text).
Identifier = Annotated[Union[StrictStr, StrictInt], AfterValidator(_name)]
# A commit-ish: a SHA, or a ref that is resolved (and pinned) at ingest.
Ref = Annotated[StrictStr, AfterValidator(_ref)]


class StrictModel(BaseModel):
    """Sidecar configs: unknown fields are errors (a typo must not be ignored). A new section is
    one more field on the model."""

    model_config = ConfigDict(extra="forbid", frozen=True)


__all__ = ["Identifier", "MAX_NAME_CHARS", "Ref", "StrictModel"]
