"""Frames <-> objects: msgpack or JSON, the two encodings of the wire protocol (never pickle).

A frame starting with ``{`` is JSON (never a valid msgpack map); anything else is msgpack. A
request is answered in the encoding it came in. ``edge/ipc/protocol.py`` declares the messages.

JSON frames are UTF-8 without a byte order mark (RFC 8259, section 8.1: JSON exchanged between
systems). ``json.loads`` would guess UTF-16 or UTF-32 from bytes, so a JSON frame is decoded here,
strictly, before it is parsed. A UTF-16 or UTF-32 frame with a BOM starts with 0xFF, 0xFE or
0x00, is sniffed as msgpack, and is refused as msgpack (MALFORMED_FRAME either way).
Per-request path: only stdlib, msgpack and numpy.
"""

from __future__ import annotations

import json
from typing import Any

import msgpack
import numpy as np

from edge.errors import ErrorCode, RequestError

__all__ = ["MSGPACK", "JSON", "ProtocolError", "sniff_encoding", "encode_obj", "decode_obj"]

MSGPACK = "msgpack"
JSON = "json"


class ProtocolError(RequestError):
    """A request the server refuses before queueing it; carries what the reply needs."""

    def __init__(self, code: ErrorCode, message: str, request_id: Any = None) -> None:
        super().__init__(message, code)
        self.request_id = request_id


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


# Byte order marks, longest first: a frame that starts with one is text, not msgpack.
_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xef\xbb\xbf", "UTF-8"),
         (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16"))
_NOT_UTF8 = "frame is not valid json: JSON must be UTF-8 (RFC 8259) without a byte order mark"


def _decode_json(frame: bytes) -> Any:
    try:
        text = str(frame, "utf-8")  # strict: no UTF-16/32 guessing, no encoded surrogates
    except UnicodeDecodeError as exc:
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, f"{_NOT_UTF8}; byte {exc.start} is not UTF-8") from None
    try:
        return json.loads(text)
    except Exception as exc:  # json and recursion errors alike
        # Only on the error path: a NUL byte (never valid in JSON text) means UTF-16 or UTF-32.
        if text[:1] == "\ufeff" or "\x00" in text:
            why = "it starts with a byte order mark" if text[:1] == "\ufeff" else "it has NUL bytes (UTF-16 or UTF-32?)"
            raise ProtocolError(ErrorCode.MALFORMED_FRAME, f"{_NOT_UTF8}; {why}") from None
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, f"frame is not valid json: {type(exc).__name__}") from None


def decode_obj(frame: bytes, encoding: str = MSGPACK) -> Any:
    """Decode one frame; raises ProtocolError(MALFORMED_FRAME) on anything invalid (JSON: not UTF-8, too)."""
    if encoding == JSON:
        return _decode_json(frame)
    try:
        return msgpack.unpackb(frame, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack, unicode and recursion errors alike
        message = f"frame is not valid {encoding}: {type(exc).__name__}"
        bom = next((name for mark, name in _BOMS if bytes(frame[:len(mark)]) == mark), None)
        if bom:  # JSON text behind a byte order mark is not sniffed as JSON (it does not start with "{")
            message += f"; it starts with a {bom} byte order mark: JSON must be UTF-8 (RFC 8259) without one"
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, message) from None
