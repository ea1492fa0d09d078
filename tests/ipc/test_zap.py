"""edge/ipc/zap.py: the ZAP handler answers RFC 27 requests on its context and stops in bounded time."""

from __future__ import annotations

import threading
import time

import pytest
import zmq
from zmq.utils import z85

from edge.ipc.zap import ZAP_ENDPOINT, ZapHandler


@pytest.fixture
def handler():
    ctx = zmq.Context()
    public, _secret = zmq.curve_keypair()
    zap = ZapHandler(ctx)
    zap.start()
    zap.configure([public])
    req = ctx.socket(zmq.REQ)
    req.linger = 0
    req.connect(ZAP_ENDPOINT)
    try:
        yield zap, req, public
    finally:
        req.close(0)
        assert zap.stop()
        ctx.term()  # returns: the handler's sockets are closed


def _ask(req: zmq.Socket, *frames: bytes) -> list[bytes]:
    req.send_multipart(list(frames))
    assert req.poll(5000), "the ZAP handler did not answer"
    return req.recv_multipart()


def test_an_allowed_curve_key_gets_200_and_its_key_as_user_id(handler):
    _zap, req, public = handler
    reply = _ask(req, b"1.0", b"7", b"", b"127.0.0.1", b"", b"CURVE", z85.decode(public))
    assert reply == [b"1.0", b"7", b"200", b"OK", public, b""]


def test_an_unknown_key_another_mechanism_and_a_malformed_request_get_400(handler):
    _zap, req, _public = handler
    stranger, _ = zmq.curve_keypair()
    assert _ask(req, b"1.0", b"1", b"", b"a", b"", b"CURVE", z85.decode(stranger))[2] == b"400"
    assert _ask(req, b"1.0", b"2", b"", b"a", b"", b"NULL")[2] == b"400"
    assert _ask(req, b"1.0", b"3", b"", b"a", b"", b"CURVE", b"short")[2] == b"400"
    assert _ask(req, b"0.9", b"4", b"", b"a", b"", b"CURVE")[2:4] == [b"400", b"Malformed request"]
    assert _ask(req, b"1.0")[2] == b"400"  # too few frames: still one answer


def test_configure_replaces_the_keys_let_in(handler):
    zap, req, public = handler
    zap.configure([])
    assert _ask(req, b"1.0", b"1", b"", b"a", b"", b"CURVE", z85.decode(public))[2] == b"400"


def test_stop_ends_the_thread_at_once_and_twice_is_harmless():
    ctx = zmq.Context()
    zap = ZapHandler(ctx)
    zap.start()
    names = {t.name for t in threading.enumerate()}
    assert "edge-zap" in names
    started = time.monotonic()
    assert zap.stop() and zap.stop()
    assert time.monotonic() - started < 2.0
    ctx.term()


def test_two_servers_in_one_process_have_a_handler_each():
    contexts = [zmq.Context(), zmq.Context()]
    handlers = [ZapHandler(c) for c in contexts]
    for h in handlers:
        h.start()
    for h, c in zip(handlers, contexts):
        assert h.stop()
        c.term()
