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

Every message is a declared type here; ``edge/ipc/codec.py`` turns them into frames.
This module is used on the per-request path: only stdlib, msgpack and numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from edge.errors import ErrorCode
from edge.ipc.codec import JSON, MSGPACK, ProtocolError, decode_obj, encode_obj, sniff_encoding

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
    "encode_request",
    "encode_reply",
    "encode_error",
    "Lineage",
    "QueueInfo",
    "InferResult",
    "HealthReply",
    "ServingInfo",
    "StatsReply",
    "CancelReply",
    "ErrorReply",
    "Reply",
    "decode_reply",
    "embeddings_from_frame",
]

VERSION = 1
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


@dataclass(slots=True)
class InferMsg:
    texts: list[str]
    request_id: RequestId | None = None
    deadline_ms: float | None = None  # relative to arrival at the server (ms)
    priority: int = 1  # 0 (first) .. 2 (last)
    truncate: bool = True  # False: a text over the model's max length is refused
    text_bytes: int = 0  # UTF-8 bytes of the texts (validation measures them)


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


def encode_request(mtype: str, body: dict, encoding: str = MSGPACK) -> list[bytes]:
    """The two frames of a request (used by the client and tests)."""
    return [encode_obj({"v": VERSION, "type": mtype}, encoding), encode_obj(body, encoding)]


# ---------------------------------------------------------------- replies
# Each reply type declares its body's fields; ``frames(encoding)`` is what the server sends.
# Field names are the protocol's (docs/protocol.md); a deprecated name is still written beside
# its replacement until protocol v2.


def encode_reply(mtype: str, body: dict, encoding: str = MSGPACK, extra: tuple = ()) -> list:
    return [encode_obj({"v": VERSION, "type": mtype}, encoding), encode_obj(body, encoding), *extra]


def _body(obj: Any) -> dict:
    """The declared fields of a reply object, without those left at None that are optional."""
    out = {}
    for name in obj.__slots__:
        value = getattr(obj, name)
        if value is None and name in obj.OPTIONAL:
            continue
        out[name] = value.as_dict() if hasattr(value, "as_dict") else value
    return out


@dataclass(slots=True, frozen=True)
class Lineage:
    """What produced a result: the package's identity, the engine, the code, the bundle.

    Built once at boot; every result carries it (flattened into the body) and ``stats``
    returns it whole."""

    model: str | None = None
    model_sha256: str | None = None
    tokenizer_sha256: str | None = None
    package_sha256: str | None = None
    bundle_sha256: str | None = None  # None outside a bundle
    engine: str | None = None
    device: str | None = None
    edge_version: str | None = None
    edge_commit: str | None = None  # the git commit edge was built from (edge/system/version.py), None if unknown

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}

    RESULT_KEYS = ("model_sha256", "tokenizer_sha256", "package_sha256", "bundle_sha256", "engine", "device",
                   "edge_version", "edge_commit")


@dataclass(slots=True)
class QueueInfo:
    """The ``queue`` block of health and stats."""

    texts: int  # texts admitted and not yet answered
    max_texts: int
    tokens: int  # their padded tokens (bucket lengths)
    max_queued_tokens: int
    in_flight: int  # requests admitted and not yet answered
    pending_text_bytes: int = 0  # UTF-8 bytes of texts received and not yet tokenized
    max_pending_text_bytes: int = 0
    by_bucket: dict | None = None  # stats only: {bucket length: texts in the scheduler's queue}

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__slots__ if k != "by_bucket" or self.by_bucket is not None}
        # Deprecated (protocol v1): "requests" counted texts, "max_tokens" is the token bound.
        d.update(requests=self.texts, max_requests=self.max_texts, max_tokens=self.max_queued_tokens)
        return d


@dataclass(slots=True)
class InferResult:
    trace_id: str
    count: int  # texts: rows of the embeddings frame
    dim: int  # floats per row
    token_counts: list  # per text, special tokens included
    buckets: list  # per text (tokens)
    truncated: list  # per text
    queue_ms: float
    compute_ms: float
    lineage: Lineage  # of what served it: the fallback's when degraded
    request_id: RequestId | None = None
    degraded: bool = False  # served by the breaker's fallback (docs/breaker.md)
    OPTIONAL = frozenset({"request_id"})

    def frames(self, encoding: str, embeddings: Any) -> list:
        """``embeddings``: a buffer of count x dim little-endian float32, sent as its own frame."""
        body = _body(self)
        lineage = body.pop("lineage")
        body.update({k: lineage[k] for k in Lineage.RESULT_KEYS})
        body["queue_ms"], body["compute_ms"] = round(self.queue_ms, 3), round(self.compute_ms, 3)
        return encode_reply("infer", body, encoding, (embeddings,))


@dataclass(slots=True)
class HealthReply:
    ready: bool
    state: str  # booting | ready | draining | stopped
    uptime_s: float
    queue: QueueInfo
    trace_id: str
    live: bool = True
    OPTIONAL = frozenset[str]()  # none (the element type, for mypy, as the others' is inferred)

    def frames(self, encoding: str) -> list:
        return encode_reply("health", _body(self), encoding)


@dataclass(slots=True)
class ServingInfo:
    """The ``settings`` block of stats: what the server enforces."""

    buckets: list
    batch_caps: dict  # bucket (str) -> rows per batch
    max_delay_ms: float
    max_text_tokens: int  # tokens per text, specials included
    max_texts: int  # texts per request
    max_text_bytes: int
    max_frame_bytes: int

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__slots__}
        d["max_tokens"] = self.max_text_tokens  # deprecated (protocol v1) name of max_text_tokens
        return d


@dataclass(slots=True)
class StatsReply:
    metrics: dict  # edge.serving.metrics.Metrics.snapshot(): its keys are the body's top level
    state: str
    queue: QueueInfo
    lineage: Lineage
    settings: ServingInfo
    timeline: dict | None
    trace_id: str
    connections: dict | None = None  # open, peak, cap, parked, parks (edge.ipc.connections)
    OPTIONAL = frozenset({"connections"})

    def frames(self, encoding: str) -> list:
        body = _body(self)
        return encode_reply("stats", {**body.pop("metrics"), **body}, encoding)


@dataclass(slots=True)
class CancelReply:
    request_id: RequestId
    cancelled: bool  # the request was still queued or running, and now ends with CANCELLED
    trace_id: str
    OPTIONAL = frozenset[str]()  # none (the element type, for mypy, as the others' is inferred)

    def frames(self, encoding: str) -> list:
        return encode_reply("cancel", _body(self), encoding)


@dataclass(slots=True)
class ErrorReply:
    code: int
    name: str
    message: str
    trace_id: str
    request_id: RequestId | None = None
    OPTIONAL = frozenset({"request_id"})

    def frames(self, encoding: str) -> list:
        return encode_reply(ERROR_TYPE, _body(self), encoding)


def encode_error(code: ErrorCode, message: str, trace_id: str, encoding: str = MSGPACK,
                 request_id: RequestId | None = None) -> list:
    return ErrorReply(int(code), ErrorCode(code).name, message, trace_id, request_id).frames(encoding)


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
