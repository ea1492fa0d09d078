"""What the I/O thread answers with: the return address of a message, and the reply bodies
that need more than one declared type (``edge/ipc/protocol.py``)."""

from __future__ import annotations

import os
import time
from typing import Any, cast

import numpy as np
import zmq

from edge.ipc import protocol as P
from edge.serving.request import Request
from edge.serving.shapes import BatchShapes

__all__ = ["Peer", "split_envelope", "peer_address", "result_frames", "serving_info", "queue_info",
           "health_reply", "stats_reply"]


class Peer:
    """Where and how to answer one message: the transport's return address and its connection,
    and what the request journal records about the sender (edge/observability/journal/)."""

    __slots__ = ("identity", "delim", "encoding", "trace_id", "conn", "received", "address", "sample")

    def __init__(self, identity: bytes, delim: bool, encoding: str, trace_id: str, conn: int,
                 address: str | None = None) -> None:
        self.identity, self.delim, self.encoding, self.trace_id = identity, delim, encoding, trace_id
        self.conn = conn  # edge.ipc.connections number: replies go only while it is open
        self.received = time.monotonic()  # s: the message was read from the socket (the request's arrival)
        self.address = address  # libzmq's Peer-Address: the client's IP on tcp, host:uid:gid:pid on ipc
        self.sample: tuple[list, list] | None = None  # (sizes, first bytes) of the frames, kept for a rejected request (--keep-rejected)


def split_envelope(frames: list[zmq.Frame], conn: int, address: str | None = None,
                   sample_bytes: int = 0) -> tuple[Peer, list]:
    """The return address of a message received with ``copy=False`` (a new trace id), and its
    frames after the envelope: as bytes when there are 2 (the protocol's count), else left in
    libzmq's memory, since the reply (WRONG_FRAME_COUNT) reads none of them. With
    ``sample_bytes``, the peer holds a copy of the frames' first bytes, in case they are refused."""
    rest: list  # zmq.Frame, or bytes once copied out below
    identity, rest = frames[0].bytes, frames[1:]
    delim = bool(rest) and len(rest[0]) == 0  # REQ sockets put an empty delimiter first
    if delim:
        rest = rest[1:]
    if len(rest) == 2:
        rest = [f.bytes for f in rest]
    first = (rest[0] if isinstance(rest[0], bytes) else rest[0].buffer[:1].tobytes()) if rest else b""
    encoding = P.sniff_encoding(first) if rest else P.MSGPACK
    peer = Peer(identity, delim, encoding, os.urandom(8).hex(), conn, address)
    if sample_bytes:
        from edge.observability.journal.rejected import capture

        peer.sample = capture(rest, sample_bytes)
    return peer, rest


def peer_address(frame: zmq.Frame) -> str | None:
    """The sender's address as libzmq reports it, or None where it reports none."""
    try:
        return cast(str, frame.get("Peer-Address"))  # a string property (get() returns int for the int ones)
    except zmq.ZMQError:
        return None


def result_frames(request: Request, peer: Peer, lineage: P.Lineage, fallback: Any = None) -> list:
    """The result of ``request``; a degraded one names ``fallback``'s lineage (what served it)."""
    out = np.ascontiguousarray(request.out, dtype=P.EMBEDDING_DTYPE)  # (N, D) little-endian float32
    degraded = bool(request.degraded)
    if degraded and fallback is not None and fallback.lineage is not None:
        lineage = fallback.lineage
    result = P.InferResult(
        trace_id=request.trace_id, count=out.shape[0], dim=out.shape[1], token_counts=request.tokens,
        buckets=request.buckets, truncated=request.truncated, queue_ms=request.queue_ms,
        compute_ms=request.compute_ms, lineage=lineage, request_id=request.request_id, degraded=degraded)
    return result.frames(peer.encoding, out.data)


def serving_info(shapes: BatchShapes, limits: P.Limits) -> P.ServingInfo:
    """The ``settings`` block of ``stats``: what the server batches and accepts."""
    return P.ServingInfo(
        buckets=list(shapes.buckets), batch_caps={str(b): shapes.rows(b) for b in shapes.buckets},
        max_delay_ms=shapes.settings.max_delay_ms, max_text_tokens=shapes.max_text_tokens,
        max_texts=limits.max_texts, max_text_bytes=limits.max_text_bytes, max_frame_bytes=limits.max_frame_bytes)


def queue_info(core: Any, in_flight: int, by_bucket: bool = False) -> P.QueueInfo:
    """The ``queue`` block of health and stats (``core``: edge.serving.core.ServingCore)."""
    depth = {str(b): core.scheduler.queued(b) for b in core.shapes.buckets} if by_bucket else None
    return P.QueueInfo(**core.admission.info(), in_flight=in_flight, by_bucket=depth)


def breaker_info(core: Any) -> dict:
    """The ``breaker`` block of stats: its state and counts, and the fallback's lineage (or null)."""
    info = core.breaker.snapshot()
    fb = core.fallback
    info["fallback"] = None if fb is None else (fb.lineage.as_dict() if fb.lineage is not None else
                                                 {"engine": fb.engine.name, "device": fb.engine.device})
    return info


def warm_up_info(core: Any) -> dict:
    """The ``warm_up`` block of stats: the shapes left to the idle engine after READY (``edge serve
    --warm-up``), those it has run (ms), and the breaker's yardstick per shape now."""
    loop = core.loop
    fallback = core.fallback
    return {"deferred_left": [f"{r}x{t}" for r, t in list(loop.warm_later)], "after_ready_ms": dict(loop.warmed_later),
            "yardstick_ms": loop.cost.as_dict() if loop.cost is not None else None,
            "fallback_deferred_left": [f"{r}x{t}" for r, t in list(fallback.warm_later)] if fallback is not None else [],
            "fallback_after_ready_ms": dict(loop.fallback_warmed_later)}


def health_reply(server: Any, peer: Peer, ready: bool, in_flight: int) -> P.HealthReply:
    """The ``health`` reply of ``server`` (edge.ipc.server.IpcServer, on its I/O thread)."""
    return P.HealthReply(ready=ready, state=server.state.value,
                         uptime_s=round(time.monotonic() - server.metrics.started, 3),
                         queue=queue_info(server.core, in_flight), trace_id=peer.trace_id)


def stats_reply(server: Any, peer: Peer, in_flight: int, connections: dict) -> P.StatsReply:
    """The ``stats`` reply of ``server`` (edge.ipc.server.IpcServer, on its I/O thread)."""
    try:
        timeline = server.timeline() if server.timeline else None
    except Exception as exc:
        timeline = {"error": f"{type(exc).__name__}: {exc}"}
    extra = server.extra_stats() if server.extra_stats else {}
    if server.journal is not None:
        extra = {**extra, "journal": server.journal.info()}
    extra = {**extra, "breaker": breaker_info(server.core), "call_cost": server.core.loop.call_cost.as_dict(),
             "warm_up": warm_up_info(server.core)}
    return P.StatsReply(metrics={**server.metrics.snapshot(), **extra}, state=server.state.value,
                        queue=queue_info(server.core, in_flight, True), lineage=server.lineage,
                        settings=serving_info(server.core.shapes, server.limits), timeline=timeline,
                        trace_id=peer.trace_id, connections=connections)
