"""Frames <-> objects: msgpack or JSON, the two encodings of the wire protocol (never pickle).

A frame starting with ``{`` is JSON (never a valid msgpack map); anything else is msgpack. A
request is answered in the encoding it came in. ``edge/ipc/protocol.py`` declares the messages.
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


def decode_obj(frame: bytes, encoding: str = MSGPACK) -> Any:
    """Decode one frame; raises ProtocolError(MALFORMED_FRAME) on anything invalid."""
    try:
        if encoding == JSON:
            return json.loads(frame)
        return msgpack.unpackb(frame, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack, json, unicode and recursion errors alike
        raise ProtocolError(ErrorCode.MALFORMED_FRAME, f"frame is not valid {encoding}: {type(exc).__name__}") from None
