"""Helpers of the journal tests: peers and requests as the I/O thread hands them to the journal."""

from __future__ import annotations

import os
import time

from edge.ipc.replies import Peer
from edge.serving.request import Request

LINEAGE = {"model": "fake-model", "model_sha256": "m" * 64, "tokenizer_sha256": "t" * 64, "package_sha256": "p" * 64,
           "bundle_sha256": None, "engine": "fake", "device": "cpu", "edge_version": "0.1.0", "edge_commit": "c" * 40}


def peer(trace_id: str | None = None, identity: bytes = b"\x00\x80\x00\x00\x01", conn: int = 3,
         address: str | None = "host:1000:1000:4242") -> Peer:
    p = Peer(identity, False, "msgpack", trace_id or os.urandom(8).hex(), conn, address)
    return p


def finished_request(p: Peer, tokens=(12, 30), buckets=(16, 32), truncated=(False, True)) -> Request:
    """A request as the engine loop hands it back: stamped, in two batches, 10 ms after it came."""
    p.received -= 0.010
    r = Request([list(range(n)) for n in tokens], list(buckets), p.received, reply_to=p, trace_id=p.trace_id,
                request_id="req-1", truncated=list(truncated), texts_in=None)
    r.enqueued = p.received + 0.0004  # 0.4 ms of load
    r.compute_ms = 5.0
    r.done = r.enqueued + 0.0062  # 1.2 ms of transfer + 5 ms of forward
    r.batches = [[7, 4], [8, 1]]
    return r


def wait_for(predicate, timeout_s: float = 5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    return predicate()
