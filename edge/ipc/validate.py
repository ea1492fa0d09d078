"""Validation of incoming requests: frames in, a declared message of ``edge/ipc/protocol.py`` out.

Each problem has its own error code (``ProtocolError``), checked in this order: frame count,
frame size, header (decoding, fields, version, type), body. Per-request path: stdlib only
beyond the codec.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from edge.errors import ErrorCode
from edge.ipc.codec import ProtocolError, decode_obj, sniff_encoding
from edge.ipc.protocol import (
    REQUEST_TYPES,
    VERSION,
    CancelMsg,
    HealthMsg,
    InferMsg,
    Limits,
    Message,
    RequestId,
    StatsMsg,
)

__all__ = ["parse_request"]


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
_EMPTY: frozenset[str] = frozenset()


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
        total = 0
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
            total += n
        msg.texts, msg.text_bytes = texts, total
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


_PARSERS: dict[str, Callable[[dict, Limits], Message]] = {
    "infer": _parse_infer, "cancel": _parse_cancel, "health": _parse_health, "stats": _parse_stats}


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
