"""What the I/O thread answers with: the return address of a message, and the reply bodies
that need more than one declared type (``edge/ipc/protocol.py``)."""

from __future__ import annotations

import os

import numpy as np
import zmq

from edge.ipc import protocol as P
from edge.serving.request import Request
from edge.serving.shapes import BatchShapes

__all__ = ["Peer", "split_envelope", "result_frames", "serving_info"]


class Peer:
    """Where and how to answer one message: the transport's return address and its connection."""

    __slots__ = ("identity", "delim", "encoding", "trace_id", "conn")

    def __init__(self, identity: bytes, delim: bool, encoding: str, trace_id: str, conn: int) -> None:
        self.identity, self.delim, self.encoding, self.trace_id = identity, delim, encoding, trace_id
        self.conn = conn  # edge.ipc.connections number: replies go only while it is open


def split_envelope(frames: list[zmq.Frame], conn: int) -> tuple[Peer, list]:
    """The return address of a message received with ``copy=False`` (a new trace id), and its
    frames after the envelope: as bytes when there are 2 (the protocol's count), else left in
    libzmq's memory, since the reply (WRONG_FRAME_COUNT) reads none of them."""
    identity, rest = frames[0].bytes, frames[1:]
    delim = bool(rest) and len(rest[0]) == 0  # REQ sockets put an empty delimiter first
    if delim:
        rest = rest[1:]
    if len(rest) == 2:
        rest = [f.bytes for f in rest]
    first = (rest[0] if isinstance(rest[0], bytes) else rest[0].buffer[:1].tobytes()) if rest else b""
    encoding = P.sniff_encoding(first) if rest else P.MSGPACK
    return Peer(identity, delim, encoding, os.urandom(8).hex(), conn), rest


def result_frames(request: Request, peer: Peer, lineage: P.Lineage) -> list:
    out = np.ascontiguousarray(request.out, dtype=P.EMBEDDING_DTYPE)  # (N, D) little-endian float32
    result = P.InferResult(
        trace_id=request.trace_id, count=out.shape[0], dim=out.shape[1], token_counts=request.tokens,
        buckets=request.buckets, truncated=request.truncated, queue_ms=request.queue_ms,
        compute_ms=request.compute_ms, lineage=lineage, request_id=request.request_id)
    return result.frames(peer.encoding, out.data)


def serving_info(shapes: BatchShapes, limits: P.Limits) -> P.ServingInfo:
    """The ``settings`` block of ``stats``: what the server batches and accepts."""
    return P.ServingInfo(
        buckets=list(shapes.buckets), batch_caps={str(b): shapes.rows(b) for b in shapes.buckets},
        max_delay_ms=shapes.settings.max_delay_ms, max_text_tokens=shapes.max_text_tokens,
        max_texts=limits.max_texts, max_text_bytes=limits.max_text_bytes, max_frame_bytes=limits.max_frame_bytes)
