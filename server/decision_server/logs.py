"""JSON-lines logging on stderr for every shard command.
The launcher re-emits shard stderr into one stream, so each line must be one self-contained JSON object."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object; `extra={"fields": {...}}` adds structured fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "target": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup_logging(level: str = "INFO") -> None:
    """JSON lines on stderr at `level`. Below INFO only the shard's own loggers go more verbose: torch's compiler,
    PIL and the rest write thousands of debug lines at load, and an operator asking for the shard's debug lines
    (`--shard-log-level debug`: one per batch of reads) wants those."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    number = logging.getLevelNamesMapping().get(level.upper())
    if number is None:
        raise ValueError(f"unknown log level {level!r}")
    root.setLevel(max(number, logging.INFO))
    logging.getLogger("decision_server").setLevel(number)
    # Libraries below us log progress bars and advice meant for notebooks; keep only their warnings.
    for noisy in ("transformers", "accelerate", "grpc", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
