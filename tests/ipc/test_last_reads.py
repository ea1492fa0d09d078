"""The reads to the end before the socket closes (edge/ipc/drain.py): every message the socket
still holds when a drain ends is answered, a cancel still pending is answered once, and a
client that keeps sending cannot hold the shutdown open."""

from __future__ import annotations

import os
import threading

import pytest
import zmq

from edge.errors import ErrorCode
from edge.ipc import protocol as P
from edge.ipc.drain import FinalReads
from edge.ipc.server import Lifecycle
from support.ipc_fakes import FakeEngine

E = ErrorCode


def _replies_by_id(client, n: int) -> dict:
    """``n`` replies, by request id; AssertionError on a second reply for an id."""
    out = {}
    for _ in range(n):
        r = client.recv(10.0)
        assert r.body["request_id"] not in out, f"two replies for {r.body['request_id']}"
        out[r.body["request_id"]] = r
    return out


def _hold_io_thread(server) -> tuple[threading.Event, threading.Event]:
    """Make the next ``health`` hold the I/O thread (nothing else is read) until ``gate`` is set."""
    entered, gate = threading.Event(), threading.Event()
    health = server._handlers["health"]

    def held(peer, msg):
        entered.set()
        gate.wait(10.0)
        health(peer, msg)

    server._handlers["health"] = held
    return entered, gate


def test_messages_still_in_the_socket_when_the_drain_ends_are_answered(make_server, make_client):
    server = make_server(drain_timeout_s=0.0)  # nothing holds the drain open: it ends at once
    entered, gate = _hold_io_thread(server)
    holder = make_client(server)
    holder.send("health", {})
    assert entered.wait(5.0)
    clients = [make_client(server) for _ in range(4)]
    n = 250  # per client: 1,000 in all, about 4 times what the I/O thread reads between two looks at its state
    for i in range(n):
        for c in clients:
            c.send("infer", {"texts": [f"q{i} a b"], "request_id": i})
    assert not server.request_drain(timeout_s=0.0)  # asked; the held I/O thread has not seen it yet
    gate.set()
    assert server.wait(10.0) and server.state is Lifecycle.STOPPED
    assert not os.path.exists(server.address[len("ipc://"):])
    for c in clients:
        got = _replies_by_id(c, n)
        assert sorted(got) == list(range(n))
        # read before the drain: served, or over the queue bound (64 texts); after it: SHUTTING_DOWN
        assert {r.body.get("code", 0) for r in got.values()} <= {0, E.OVERLOADED, E.SHUTTING_DOWN}
        with pytest.raises(TimeoutError):
            c.recv(0.2)  # nothing more: exactly one each
    assert holder.recv(5.0).type == "health"
    assert server.last_reads["cut"] is None and not server.last_reads["left_unread"]


def test_a_cancel_pending_at_the_drain_timeout_is_answered_once(make_server, make_client):
    engine = FakeEngine()
    server = make_server(engine, drain_timeout_s=0.3)
    c = make_client(server)
    engine.release.clear()  # the engine holds the request: the cancel waits behind it
    c.send("infer", {"texts": ["stuck"], "request_id": 1})
    assert engine.running.wait(5.0)
    c.send("cancel", {"request_id": 1})
    c.send("health", {})  # read after the cancel, on the same connection
    assert c.recv(5.0).type == "health"
    server.request_drain()
    got = [c.recv(5.0), c.recv(5.0)]
    engine.release.set()  # the cancel's own outcome now comes, late: it must not be sent
    assert server.wait(10.0)
    infer = next(r for r in got if r.type == "error")
    cancel = next(r for r in got if r.type == "cancel")
    assert infer.body["code"] == E.SHUTTING_DOWN and infer.body["request_id"] == 1
    assert cancel.body == {**cancel.body, "request_id": 1, "cancelled": False}
    with pytest.raises(TimeoutError):
        c.recv(0.3)


@pytest.mark.parametrize("bound, reads, body", [
    ("time", FinalReads(max_s=0.3), {}),
    ("bytes", FinalReads(max_bytes=1 << 20), {"texts": ["x" * 16384]}),
], ids=["time", "bytes"])
def test_a_client_that_keeps_sending_cannot_hold_the_shutdown_open(make_server, bound, reads, body):
    server = make_server(drain_timeout_s=0.0)
    server.final_reads = reads
    ctx = zmq.Context()
    flood = ctx.socket(zmq.DEALER)
    flood.setsockopt(zmq.LINGER, 0)
    flood.connect(server.address)
    frames = P.encode_request("infer" if body else "health", body)
    sending, stop, sent = threading.Event(), threading.Event(), [0]

    def send_until_stopped():
        while not stop.is_set():
            try:
                flood.send_multipart(frames, zmq.NOBLOCK)
                sent[0] += 1
            except zmq.Again:  # its queue is full: the server is not reading; try again
                pass
            if sent[0] >= 200:
                sending.set()

    t = threading.Thread(target=send_until_stopped, daemon=True)
    t.start()
    try:
        assert sending.wait(10.0)
        server.request_drain()
        assert server.wait(10.0)  # ended by the bound, the flood still going
    finally:
        stop.set()
        t.join(5.0)
        flood.close(0)
        ctx.term()
    assert server.last_reads["cut"] == bound, server.last_reads
