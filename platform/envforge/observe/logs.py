"""Structured logs: one JSON object per line, each carrying the ids that tie it to everything else.

The ids live in a context (contextvars), bound where they become known and inherited by all
code below, including the worker threads of `run_blocking`:

    with log_context(batch_id=..., dagster_run_id=..., mlflow_run_id=...):   # the stage
        with log_context(trajectory_id=..., task_id=..., task_version=...):   # the episode
            with log_context(container_id=sandbox.id): ...                    # after reset

Library code logs with the standard library (`logging.getLogger("envforge.rollout")`); nothing
is printed unless the process installs a handler: `configure_logging()` (the CLI does it when
ENVFORGE_LOG_FORMAT=json) or the host application's own.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from contextlib import contextmanager
from typing import Any, Iterator, TextIO

CONTEXT_FIELDS = (
    "trajectory_id",
    "task_id",
    "task_version",
    "batch_id",
    "container_id",
    "dagster_run_id",
    "mlflow_run_id",
)
_CONTEXT: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("envforge_log_context", default={})
# LogRecord attributes that are not `extra=` fields
_handler: logging.Handler | None = None
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


def current_context() -> dict[str, Any]:
    return dict(_CONTEXT.get())


@contextmanager
def log_context(**ids: Any) -> Iterator[dict[str, Any]]:
    """Bind ids (None values are skipped) for the code inside; restores the outer ones after."""
    merged = {**_CONTEXT.get(), **{k: v for k, v in ids.items() if v not in (None, "")}}
    token = _CONTEXT.set(merged)
    try:
        yield merged
    finally:
        _CONTEXT.reset(token)


def bind(**ids: Any) -> None:
    """Add ids to the current context in place (for ids learnt mid-way, like the container's)."""
    _CONTEXT.set({**_CONTEXT.get(), **{k: v for k, v in ids.items() if v not in (None, "")}})


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "event", <every context field, null when unknown>, <extra=...>}`."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        ctx = _CONTEXT.get()
        for name in CONTEXT_FIELDS:
            doc[name] = ctx.get(name)
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


def configure_logging(stream: TextIO | None = None, level: int | str = logging.INFO) -> logging.Handler:
    """Send envforge's loggers to `stream` (stderr) as JSON lines; returns the handler (to remove it).
    Calling it again replaces the handler it installed before (no line is written twice)."""
    global _handler
    logger = logging.getLogger("envforge")
    if _handler is not None:
        logger.removeHandler(_handler)
    _handler = logging.StreamHandler(stream or sys.stderr)
    _handler.setFormatter(JsonFormatter())
    logger.addHandler(_handler)
    logger.setLevel(level)
    return _handler


def configure_logging_from_env() -> logging.Handler | None:
    """JSON logs on stderr when ENVFORGE_LOG_FORMAT=json (level ENVFORGE_LOG_LEVEL, default INFO)."""
    from envforge.settings import read_env

    env = read_env()
    fmt = env.log_format.lower()
    if fmt == "text":
        return None
    if fmt != "json":
        raise ValueError(f"environment variable ENVFORGE_LOG_FORMAT: expected 'json' or 'text', got {fmt!r}")
    return configure_logging(level=env.log_level.upper())
