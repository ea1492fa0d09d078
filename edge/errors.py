"""Errors of the edge runtime, with stable numeric codes.

Across the socket an error is data: ``{"code": int, "name": str, "message": str}``.
The codes below are a contract with client apps: never renumber or reuse one;
add new codes at the end of their range.

Hierarchy::

    EdgeError                      code, name, message, recoverable
     ├── RequestError       1xxx   the request is malformed or invalid; resending it as is fails again
     ├── FlowError          2xxx   the request was valid but not served now (overload, deadline,
     │                             cancel, shutdown); a retry may succeed
     ├── InternalError      3xxx   the server failed while serving a valid request
     └── BootError          4xxx   the runtime cannot start; names the stage and the setting to change
          ├── PackageError         model package missing, truncated, tampered (names the file)
          ├── TokenizerError       tokenizer file invalid or unsupported
          └── EngineError          engine unavailable or failed to load
"""

from __future__ import annotations

from enum import IntEnum

__all__ = [
    "ErrorCode",
    "EdgeError",
    "RequestError",
    "FlowError",
    "InternalError",
    "BootError",
    "PackageError",
    "TokenizerError",
    "EngineError",
    "error_class_for",
]


class ErrorCode(IntEnum):
    # 1xxx: malformed or invalid request (not recoverable by retrying as is)
    MALFORMED_FRAME = 1000  # a frame is not valid msgpack/JSON
    WRONG_FRAME_COUNT = 1001  # too few or too many frames after the envelope
    UNSUPPORTED_VERSION = 1002  # protocol version this server does not speak
    UNKNOWN_TYPE = 1003  # message type not in the protocol
    INVALID_FIELD = 1004  # missing field or field of the wrong type
    EMPTY_TEXT = 1005  # a text is empty, whitespace only, or only characters the tokenizer removes
    TEXT_TOO_LONG = 1006  # a text exceeds the byte limit
    TOO_MANY_TEXTS = 1007  # more texts in one request than allowed
    INVALID_OPTION = 1008  # an option has a value outside its range
    TOO_MANY_TOKENS = 1009  # text longer than the model's max length and truncate=false
    FRAME_TOO_LARGE = 1010  # a frame exceeds the size limit
    DUPLICATE_REQUEST_ID = 1011  # a request id already in flight for this client
    # 2xxx: flow control (valid request, not served now; retry may succeed)
    OVERLOADED = 2000  # queue bound (requests or tokens) reached
    DEADLINE_EXCEEDED = 2001  # deadline passed before the request ran
    CANCELLED = 2002  # cancelled by a cancel message
    SHUTTING_DOWN = 2003  # server is draining after SIGTERM
    NOT_READY = 2004  # server has not finished booting
    UNKNOWN_REQUEST_ID = 2005  # cancel named a request that is not queued
    BREAKER_OPEN = 2006  # the circuit breaker is open and no fallback is configured: retry after its cool-down
    # 3xxx: server failures
    INTERNAL = 3000  # unexpected failure while handling a valid request
    ENGINE_FAILED = 3001  # the engine raised while running a batch
    # 4xxx: boot failures (logged and turned into a non-zero exit, rarely on the wire)
    PACKAGE_INVALID = 4000  # manifest unreadable or inconsistent
    PACKAGE_FILE_MISSING = 4001  # a file named by the manifest is absent
    PACKAGE_HASH_MISMATCH = 4002  # a file's sha256 differs from the manifest
    PACKAGE_SIZE_MISMATCH = 4003  # a file's size differs from the manifest (truncated)
    TOKENIZER_INVALID = 4010  # tokenizer file is not a valid compiled tokenizer
    TOKENIZER_UNSUPPORTED = 4011  # tokenizer.json uses a component we cannot compile
    ENGINE_UNAVAILABLE = 4020  # engine library not installed or device not present
    ENGINE_LOAD_FAILED = 4021  # engine library refused the model
    BOOT_STAGE_FAILED = 4030  # any other failure of a boot stage
    SNAPSHOT_STALE = 4031  # restored from a snapshot whose mapped files changed since: boot fresh
    METRICS_UNAVAILABLE = 4032  # a --metrics-* flag is set and prometheus-client is not installed


class EdgeError(Exception):
    """Base of every error the runtime raises on purpose."""

    code: ErrorCode = ErrorCode.INTERNAL
    recoverable: bool = False

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = ErrorCode(code)

    @property
    def name(self) -> str:
        return self.code.name

    def to_wire(self) -> dict:
        return {"code": int(self.code), "name": self.code.name, "message": self.message}

    def __str__(self) -> str:
        return f"[{int(self.code)} {self.code.name}] {self.message}"


class RequestError(EdgeError):
    code = ErrorCode.INVALID_FIELD
    recoverable = False


class FlowError(EdgeError):
    code = ErrorCode.OVERLOADED
    recoverable = True


class InternalError(EdgeError):
    code = ErrorCode.INTERNAL
    recoverable = True


class BootError(EdgeError):
    """A boot stage failed. ``stage`` names it; ``setting`` names what to change."""

    code = ErrorCode.BOOT_STAGE_FAILED

    def __init__(
        self,
        message: str,
        code: ErrorCode | None = None,
        *,
        stage: str | None = None,
        setting: str | None = None,
    ) -> None:
        super().__init__(message, code)
        self.stage = stage
        self.setting = setting

    def __str__(self) -> str:
        text = super().__str__()
        if self.stage:
            text = f"boot stage '{self.stage}' failed: {text}"
        if self.setting:
            text += f" (change: {self.setting})"
        return text


class PackageError(BootError):
    code = ErrorCode.PACKAGE_INVALID

    def __init__(self, message: str, code: ErrorCode | None = None, *, file: str | None = None, **kw) -> None:
        super().__init__(message, code, **kw)
        self.file = file


class TokenizerError(BootError):
    code = ErrorCode.TOKENIZER_INVALID


class EngineError(BootError):
    code = ErrorCode.ENGINE_LOAD_FAILED


_RANGE_CLASS = {1: RequestError, 2: FlowError, 3: InternalError, 4: BootError}


def error_class_for(code: ErrorCode) -> type[EdgeError]:
    """The exception class that carries ``code`` (by its thousands range)."""
    return _RANGE_CLASS.get(int(code) // 1000, EdgeError)
