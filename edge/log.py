"""One JSON object per log line, on stdout (journald and runc keep it)."""

from __future__ import annotations

import json
import sys
import time

__all__ = ["log", "log_exception"]


def log(event: str, **fields) -> None:
    record = {"ts": round(time.time(), 6), "event": event}
    record.update(fields)
    try:
        sys.stdout.write(json.dumps(record, default=str, separators=(",", ":")) + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass  # a closed stdout must not take the runtime down


def log_exception(event: str, **fields) -> None:
    """:func:`log` from inside an ``except`` block, with the traceback as a field."""
    import traceback  # only on the error path: not an import every boot pays

    log(event, **fields, error=traceback.format_exc(limit=20))
