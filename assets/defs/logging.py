"""A compact console logger: `HH:MM:SS step: message` instead of Dagster's 120-character prefix.

Dagster stores every event in the instance regardless of loggers; this only changes what a
terminal shows (the demo, `dagster dev` output, compute logs), so progress lines stay readable.
"""

import logging
import sys
import time

import dagster as dg


class CompactFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        meta = getattr(record, "dagster_meta", None) or {}
        where = meta.get("step_key") or meta.get("job_name") or record.name
        message = meta.get("orig_message") or record.getMessage()
        return f"{time.strftime('%H:%M:%S', time.localtime(record.created))} {where}: {message}"


@dg.logger(config_schema={"log_level": dg.Field(str, is_required=False, default_value="INFO")},
           description="Compact console lines (time, step, message) at the configured level (default INFO).")
def compact_console_logger(init_context: dg.InitLoggerContext) -> logging.Logger:
    logger = logging.Logger("envforge.dagster", level=init_context.logger_config["log_level"].upper())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(CompactFormatter())
    logger.addHandler(handler)
    return logger
