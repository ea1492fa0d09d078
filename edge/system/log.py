"""Logs: stdlib ``logging`` with a JSON formatter, one object per line on stdout.

journald and runc keep stdout. Every line is ``{"ts", "level", "event", ...fields}``; a line
about a request carries its ``trace_id`` (a batch's, ``trace_ids``). :func:`log` is the call the
runtime uses; any other library's records that reach the ``edge`` logger are formatted the
same way. ``EDGE_LOG_LEVEL`` / ``edge serve --log-level`` sets the level (:func:`configure`);
at ``debug`` every reply adds a line, so the per-request path checks :func:`debug_enabled`
before it builds one.

``logging`` costs about 14 ms of import here; boot imports it on the main thread while the
engine thread warms up (``import_server``), where nothing waits for it.
"""

from __future__ import annotations

import json
import logging
import sys
import time

__all__ = ["log", "log_exception", "configure", "debug_enabled", "JsonFormatter", "LOGGER"]

LOGGER = logging.getLogger("edge")
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class JsonFormatter(logging.Formatter):
    """A record as one JSON object: time, level, event (the message) and the record's fields."""

    def format(self, record: logging.LogRecord) -> str:
        obj = {"ts": round(record.created, 6), "level": record.levelname.lower(), "event": record.getMessage()}
        obj.update(getattr(record, "fields", None) or {})
        if record.exc_info and "error" not in obj:
            obj["error"] = self.formatException(record.exc_info)
        return json.dumps(obj, default=str, separators=(",", ":"))


class _StdoutHandler(logging.Handler):
    """Writes to whatever ``sys.stdout`` is at the time (tests swap it); a closed stdout is
    ignored: it must not take the runtime down, nor print a traceback of its own."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stdout.write(self.format(record) + "\n")
            sys.stdout.flush()
        except (OSError, ValueError):
            pass

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        pass


def _install() -> None:
    handler = _StdoutHandler()
    handler.setFormatter(JsonFormatter())
    LOGGER.addHandler(handler)
    LOGGER.setLevel(logging.INFO)
    LOGGER.propagate = False  # the root logger's handlers (pytest's, an app's) would print it twice


_install()


def configure(level: str = "info") -> None:
    """Set the level: "debug", "info", "warning" or "error"."""
    LOGGER.setLevel(_LEVELS[level])


def debug_enabled() -> bool:
    return LOGGER.isEnabledFor(logging.DEBUG)


def log(event: str, level: str = "info", **fields) -> None:
    """One line: ``event`` and ``fields`` (JSON-able; anything else is written as its str)."""
    lvl = _LEVELS[level]
    if LOGGER.isEnabledFor(lvl):
        record = LOGGER.makeRecord(LOGGER.name, lvl, "edge", 0, event, (), None)  # no %-args, as Logger.info("x")
        record.created = time.time()
        record.fields = fields
        LOGGER.handle(record)


def log_exception(event: str, level: str = "error", **fields) -> None:
    """:func:`log` from inside an ``except`` block, with the traceback as the ``error`` field."""
    import traceback  # only on the error path

    log(event, level, **fields, error=traceback.format_exc(limit=20))
