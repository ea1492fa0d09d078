"""Wire messages of the edge serving socket (protocol version 1).

Every message is a ZeroMQ multipart message. A request is exactly two frames,
``[header, body]``; a reply is ``[header, body]`` plus, for an ``infer``
result, one frame of embeddings (little-endian float32, row-major,
``count x dim``). Both header and body are msgpack maps, or JSON objects: a
request whose header frame starts with ``{`` is JSON and is answered in JSON.
Never pickle. ``docs/protocol.md`` is the reference for other languages.

The header is ``{"v": 1, "type": <str>}``. Request types: ``infer``,
``cancel``, ``health``, ``stats``. A reply's type is the request's type, or
``error`` with the body ``{"code", "name", "message", "trace_id",
"request_id"?}``.

This module is used on the per-request path: only stdlib, msgpack and numpy.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Union

import msgpack
import numpy as np

from edge.errors import ErrorCode, RequestError

__all__ = [
    "VERSION",
    "MSGPACK",
    "JSON",
    "REQUEST_TYPES",
    "ERROR_TYPE",
    "Limits",
    "ProtocolError",
    "InferMsg",
    "CancelMsg",
    "HealthMsg",
    "StatsMsg",
    "Message",
    "RequestId",
    "sniff_encoding",
    "encode_obj",
    "decode_obj",
    "parse_request",
    "encode_request",
    "encode_reply",
    "encode_error",
    "Reply",
    "decode_reply",
    "embeddings_from_frame",
]

VERSION = 1
MSGPACK = "msgpack"
JSON = "json"
REQUEST_TYPES = ("infer", "cancel", "health", "stats")
ERROR_TYPE = "error"
EMBEDDING_DTYPE = np.dtype("<f4")  # little-endian IEEE-754 float32 on the wire

RequestId = Union[str, int]


@dataclass(frozen=True)
class Limits:
    """Per-message limits the server enforces before any work is queued."""

    max_texts: int = 64  # texts per infer request
    max_text_bytes: int = 32768  # UTF-8 bytes per text (bytes)
    max_frame_bytes: int = 4 * 1024 * 1024  # any single frame (bytes); over it: FRAME_TOO_LARGE
    max_request_id_chars: int = 128  # a string request id (characters)
    max_deadline_ms: float = 3_600_000.0  # deadline_ms upper bound (ms): one hour


class ProtocolError(RequestError):
    """A request the server refuses before queueing it; carries what the reply needs."""

    def __init__(self, code: ErrorCode, message: str, request_id: RequestId | None = None) -> None:
        super().__init__(message, code)
        self.request_id = request_id


@dataclass(slots=True)
class InferMsg:
    texts: list[str]
    request_id: RequestId | None = None
    deadline_ms: float | None = None  # relative to arrival at the server (ms)
    priority: int = 1  # 0 (first) .. 2 (last)
    truncate: bool = True  # False: a text over the model's max length is refused


@dataclass(slots=True)
class CancelMsg:
    request_id: RequestId


@dataclass(slots=True)
class HealthMsg:
    pass


@dataclass(slots=True)
class StatsMsg:
    pass


Message = Union[InferMsg, CancelMsg, HealthMsg, StatsMsg]


# ---------------------------------------------------------------- encoding


def sniff_encoding(frame: bytes) -> str:
    """JSON when the frame starts with ``{`` (never a valid msgpack map), else msgpack."""
    return JSON if frame[:1] == b"{" else MSGPACK


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)


def encode_obj(obj: Any, encoding: str = MSGPACK) -> bytes:
    if encoding == JSON:
        return json.dumps(obj, separators=(",", ":"), default=_json_default).encode()
    return msgpack.packb(obj, use_bin_type=True, default=_json_default)


def decode_obj(frame: bytes, encoding: str = MSGPACK) -> Any:
    """Decode one frame; raises ProtocolError(MALFORMED_FRAME) on anything invalid."""
    try:
        if encoding == JSON:
            return json.loads(frame)
        return msgpack.unpackb(frame, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack, json, unicode and recursion errors alike
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, f"frame is not valid {encoding}: {type(exc).__name__}") from None


# ---------------------------------------------------------------- requests


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_keys(body: dict, allowed: frozenset, what: str) -> None:
    extra = [k for k in body if k not in allowed]
    if extra:
        raise ProtocolError(ErrorCode.INVALID_FIELD, f"unknown field(s) in {what}: {sorted(map(str, extra))[:5]}")


def _request_id(v: Any, limits: Limits) -> RequestId:
    if isinstance(v, str):
        if not 1 <= len(v) <= limits.max_request_id_chars:
            raise ProtocolError(ErrorCode.INVALID_OPTION, f"request_id must have 1..{limits.max_request_id_chars} characters")
        return v
    if _is_int(v):
        if not 0 <= v < 2**63:
            raise ProtocolError(ErrorCode.INVALID_OPTION, "request_id integer must be in 0..2^63-1")
        return v
    raise ProtocolError(ErrorCode.INVALID_FIELD, "request_id must be a string or an integer")


_INFER_KEYS = frozenset({"texts", "request_id", "deadline_ms", "priority", "truncate"})
_CANCEL_KEYS = frozenset({"request_id"})
_EMPTY = frozenset()


def _parse_infer(body: dict, limits: Limits) -> InferMsg:
    rid = None
    if body.get("request_id") is not None:
        rid = _request_id(body["request_id"], limits)
    try:
        _check_keys(body, _INFER_KEYS, "infer")
        msg = InferMsg(texts=[], request_id=rid)
        d = body.get("deadline_ms")
        if d is not None:
            if not isinstance(d, (int, float)) or isinstance(d, bool):
                raise ProtocolError(ErrorCode.INVALID_FIELD, "deadline_ms must be a number")
            if not (math.isfinite(d) and 0 < d <= limits.max_deadline_ms):
                raise ProtocolError(ErrorCode.INVALID_OPTION, f"deadline_ms must be in (0, {limits.max_deadline_ms:g}]")
            msg.deadline_ms = float(d)
        p = body.get("priority")
        if p is not None:
            if not _is_int(p):
                raise ProtocolError(ErrorCode.INVALID_FIELD, "priority must be an integer")
            if not 0 <= p <= 2:
                raise ProtocolError(ErrorCode.INVALID_OPTION, "priority must be 0, 1 or 2")
            msg.priority = p
        t = body.get("truncate")
        if t is not None:
            if not isinstance(t, bool):
                raise ProtocolError(ErrorCode.INVALID_FIELD, "truncate must be a boolean")
            msg.truncate = t
        texts = body.get("texts")
        if not isinstance(texts, list):
            raise ProtocolError(ErrorCode.INVALID_FIELD, "texts must be an array of strings")
        if not texts:
            raise ProtocolError(ErrorCode.INVALID_FIELD, "texts must hold at least one text")
        if len(texts) > limits.max_texts:
            raise ProtocolError(ErrorCode.TOO_MANY_TEXTS, f"{len(texts)} texts, at most {limits.max_texts} per request")
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise ProtocolError(ErrorCode.INVALID_FIELD, f"texts[{i}] is not a string")
            try:
                n = len(text.encode("utf-8"))
            except UnicodeEncodeError:
                raise ProtocolError(ErrorCode.INVALID_FIELD, f"texts[{i}] is not valid Unicode") from None
            if n > limits.max_text_bytes:
                raise ProtocolError(ErrorCode.TEXT_TOO_LONG, f"texts[{i}] has {n} bytes, at most {limits.max_text_bytes}")
            if not text.strip():
                raise ProtocolError(ErrorCode.EMPTY_TEXT, f"texts[{i}] is empty or whitespace only")
        msg.texts = texts
        return msg
    except ProtocolError as exc:
        exc.request_id = rid
        raise


def _parse_cancel(body: dict, limits: Limits) -> CancelMsg:
    _check_keys(body, _CANCEL_KEYS, "cancel")
    if "request_id" not in body:
        raise ProtocolError(ErrorCode.INVALID_FIELD, "cancel needs a request_id")
    return CancelMsg(_request_id(body["request_id"], limits))


def _parse_health(body: dict, limits: Limits) -> HealthMsg:
    _check_keys(body, _EMPTY, "health")
    return HealthMsg()


def _parse_stats(body: dict, limits: Limits) -> StatsMsg:
    _check_keys(body, _EMPTY, "stats")
    return StatsMsg()


_PARSERS = {"infer": _parse_infer, "cancel": _parse_cancel, "health": _parse_health, "stats": _parse_stats}


def parse_request(frames: list, limits: Limits = Limits()) -> tuple[str, Message]:
    """Validate the frames after the routing envelope: ``(type, message)``.

    Raises ProtocolError with the code of the first problem found, in this order:
    frame count, frame size, header (decoding, fields, version, type), body.
    """
    if len(frames) != 2:
        raise ProtocolError(ErrorCode.WRONG_FRAME_COUNT, f"expected 2 frames (header, body), got {len(frames)}")
    for i, f in enumerate(frames):
        if len(f) > limits.max_frame_bytes:
            raise ProtocolError(ErrorCode.FRAME_TOO_LARGE, f"frame {i} has {len(f)} bytes, at most {limits.max_frame_bytes}")
    encoding = sniff_encoding(frames[0])
    header = decode_obj(frames[0], encoding)
    if not isinstance(header, dict):
        raise ProtocolError(ErrorCode.INVALID_FIELD, "header must be a map")
    v, mtype = header.get("v"), header.get("type")
    if not _is_int(v) or not isinstance(mtype, str) or len(header) != 2:
        raise ProtocolError(ErrorCode.INVALID_FIELD, 'header must be exactly {"v": int, "type": str}')
    if v != VERSION:
        raise ProtocolError(ErrorCode.UNSUPPORTED_VERSION, f"protocol version {v} not supported; this server speaks {VERSION}")
    parser = _PARSERS.get(mtype)
    if parser is None:
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {mtype[:40]!r}; known: {', '.join(REQUEST_TYPES)}")
    body = decode_obj(frames[1], encoding)
    if not isinstance(body, dict):
        raise ProtocolError(ErrorCode.INVALID_FIELD, "body must be a map")
    return mtype, parser(body, limits)


def encode_request(mtype: str, body: dict, encoding: str = MSGPACK) -> list[bytes]:
    """The two frames of a request (used by the client and tests)."""
    return [encode_obj({"v": VERSION, "type": mtype}, encoding), encode_obj(body, encoding)]


# ---------------------------------------------------------------- replies


def encode_reply(mtype: str, body: dict, encoding: str = MSGPACK, extra: tuple = ()) -> list:
    return [encode_obj({"v": VERSION, "type": mtype}, encoding), encode_obj(body, encoding), *extra]


def encode_error(
    code: ErrorCode, message: str, trace_id: str, encoding: str = MSGPACK, request_id: RequestId | None = None
) -> list:
    body = {"code": int(code), "name": ErrorCode(code).name, "message": message, "trace_id": trace_id}
    if request_id is not None:
        body["request_id"] = request_id
    return encode_reply(ERROR_TYPE, body, encoding)


@dataclass(slots=True)
class Reply:
    type: str
    body: dict
    extra: list  # frames after the body (the embeddings frame of an infer result)

    @property
    def is_error(self) -> bool:
        return self.type == ERROR_TYPE


def decode_reply(frames: list) -> Reply:
    """Decode a reply's frames (after any REQ delimiter). Raises ValueError when malformed."""
    if len(frames) < 2:
        raise ValueError(f"reply has {len(frames)} frames, expected at least 2")
    encoding = sniff_encoding(bytes(frames[0][:1]))
    try:
        header = decode_obj(bytes(frames[0]), encoding)
        body = decode_obj(bytes(frames[1]), encoding)
    except ProtocolError as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(header, dict) or header.get("v") != VERSION or not isinstance(body, dict):
        raise ValueError(f"unexpected reply header {header!r}")
    return Reply(str(header.get("type")), body, list(frames[2:]))


def embeddings_from_frame(frame: Any, count: int, dim: int) -> np.ndarray:
    """(count, dim) float32 in native order from the little-endian embeddings frame."""
    arr = np.frombuffer(frame, dtype=EMBEDDING_DTYPE)
    if arr.size != count * dim:
        raise ValueError(f"embeddings frame has {arr.size} floats, expected {count}x{dim}")
    return arr.reshape(count, dim).astype(np.float32, copy=False)
