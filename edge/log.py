"""One JSON object per log line, on stdout (journald and runc keep it)."""

from __future__ import annotations

import json
import sys
import time

__all__ = ["log"]


def log(event: str, **fields) -> None:
    record = {"ts": round(time.time(), 6), "event": event}
    record.update(fields)
    try:
        sys.stdout.write(json.dumps(record, default=str, separators=(",", ":")) + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass  # a closed stdout must not take the runtime down
