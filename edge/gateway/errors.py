"""The runtime's error codes as HTTP statuses, and each API's own error body.

One table (:data:`STATUS`) maps a code to its status; the gateway's own refusals (a body too
large, malformed JSON, a slow client) are :class:`HttpError` too, with the runtime's nearest
code, so every error leaves through :func:`openai_body` or :func:`tei_body` and carries its trace id.
"""

from __future__ import annotations

import os

from edge.errors import ErrorCode

__all__ = ["HttpError", "STATUS", "RETRY_AFTER_S", "status_of", "from_edge_error", "openai_body", "tei_body",
           "new_trace_id"]

RETRY_AFTER_S = 1  # what 429 and 503 tell a client to wait (s): a queue of MiniLM drains in well under that

STATUS = {
    ErrorCode.OVERLOADED: 429,
    ErrorCode.DEADLINE_EXCEEDED: 504,
    ErrorCode.NOT_READY: 503,
    ErrorCode.SHUTTING_DOWN: 503,
    ErrorCode.BREAKER_OPEN: 503,
    ErrorCode.CANCELLED: 503,
    ErrorCode.FRAME_TOO_LARGE: 413,
}


def status_of(code: ErrorCode) -> int:
    if code in STATUS:
        return STATUS[code]
    if 1000 <= code < 2000:
        return 400  # an invalid request; TEI's body says 422 for validation (tei_status)
    return 500


def new_trace_id() -> str:
    """A trace id of the gateway's own, for errors that never reached the runtime (16 hex digits)."""
    return os.urandom(8).hex()


class HttpError(Exception):
    def __init__(self, status: int, code: ErrorCode, message: str, *, trace_id: str | None = None,
                 param: str | None = None, api_code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.trace_id = trace_id or new_trace_id()
        self.param = param
        self.api_code = api_code  # OpenAI's own ``code`` where the runtime has none (a 401: "invalid_api_key")

    @property
    def retry_after(self) -> int | None:
        return RETRY_AFTER_S if self.status in (429, 503) else None


def from_edge_error(exc) -> HttpError:
    """An ``edge.errors.EdgeError`` from the runtime (``trace_id`` set by ``raise_for_error``)."""
    return HttpError(status_of(exc.code), exc.code, exc.message, trace_id=getattr(exc, "trace_id", None))


_OPENAI_TYPE = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
                408: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
                503: "service_unavailable", 504: "timeout"}


def openai_body(err: HttpError) -> dict:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}`` (plus the trace id)."""
    return {"error": {"message": err.message, "type": _OPENAI_TYPE.get(err.status, "server_error"),
                      "param": err.param, "code": err.api_code or err.code.name.lower(), "trace_id": err.trace_id}}


def tei_status(err: HttpError) -> int:
    """TEI answers validation errors 422 and an empty input 400."""
    if err.status == 400:
        return 400 if err.code == ErrorCode.EMPTY_TEXT or err.code == ErrorCode.MALFORMED_FRAME else 422
    return err.status


_TEI_TYPE = {400: "Empty", 401: "Unauthorized", 408: "Validation", 413: "Validation", 422: "Validation",
             429: "Overloaded", 503: "Unhealthy", 504: "Backend"}


def tei_body(err: HttpError) -> dict:
    """TEI's error shape: ``{"error": str, "error_type": str}`` (plus the code and the trace id)."""
    return {"error": err.message, "error_type": _TEI_TYPE.get(tei_status(err), "Backend"),
            "code": err.code.name, "trace_id": err.trace_id}
