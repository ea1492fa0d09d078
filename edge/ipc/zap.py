"""The ZAP handler of a CURVE server (ZeroMQ RFC 27): it lets in the client public keys it was
given and no other.

libzmq asks the handler about every CURVE handshake on the context, over the fixed inproc
endpoint ``inproc://zeromq.zap.01``, and waits for its answer; with no handler bound it lets
every client in. So the handler is bound before the server's ROUTER, answers from one
thread of its own, and never waits on anything but its two sockets.

Why not zmq.auth's ``ThreadAuthenticator``: it runs an asyncio loop on its thread, polls
ZeroMQ's edge-triggered descriptors through it, and its ``stop()`` joins that thread without
a limit; one missed wake-up there left a CI run hung for an hour at a server's close. Here a
plain ``zmq.Poller`` (level-triggered ``zmq_poll``) waits on the ZAP socket and a stop pipe,
and :meth:`ZapHandler.stop` waits a bounded time. It also keeps asyncio off the boot path.
"""

from __future__ import annotations

import itertools
import logging
import threading

import zmq
from zmq.utils import z85

__all__ = ["ZAP_ENDPOINT", "ZapHandler"]

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by RFC 27: libzmq sends every context's requests here
ZAP_VERSION = b"1.0"
STOP_JOIN_S = 2.0  # how long stop() waits for the thread (it answers within one poll, ~immediately)
_ids = itertools.count()  # a stop pipe's endpoint per handler: two servers may share a process


class ZapHandler:
    """Answers ZAP requests on ``ctx``: CURVE clients whose public key (Z85) is in ``allowed``
    get 200, every other request 400. Its verdicts are logged at debug level on ``log``, one
    line per handshake, with the client's key: ``ALLOWED (CURVE) domain=* client_key=b'...'``."""

    def __init__(self, ctx: zmq.Context, log: logging.Logger | None = None) -> None:
        self._ctx = ctx
        self._log = log or logging.getLogger("edge.zap")
        self._allowed: frozenset[bytes] = frozenset()
        self._stop_endpoint = f"inproc://edge.zap.stop.{next(_ids)}"
        self._stop_send: zmq.Socket | None = None
        self._thread: threading.Thread | None = None

    def configure(self, allowed: list[bytes]) -> None:
        """The Z85 public keys to let in from now on (one assignment: the thread reads it whole)."""
        self._allowed = frozenset(allowed)

    def start(self) -> None:
        """Bind the ZAP endpoint here, before the caller binds its server; answer on a thread."""
        zap = self._ctx.socket(zmq.REP)
        zap.linger = 0
        zap.bind(ZAP_ENDPOINT)
        stop_recv = self._ctx.socket(zmq.PAIR)
        stop_recv.linger = 0
        stop_recv.bind(self._stop_endpoint)
        self._stop_send = self._ctx.socket(zmq.PAIR)
        self._stop_send.linger = 0
        self._stop_send.connect(self._stop_endpoint)
        # The sockets move to the thread now and are used only there (a handover ZeroMQ allows).
        self._thread = threading.Thread(target=self._serve, args=(zap, stop_recv), name="edge-zap", daemon=True)
        self._thread.start()

    def stop(self) -> bool:
        """Stop the thread (it closes its sockets, so the context's term() is not held up);
        False if it did not end within :data:`STOP_JOIN_S`."""
        if self._stop_send is None:
            return True
        try:
            self._stop_send.send(b"", zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # the thread already ended: its end of the pipe is gone
        self._stop_send.close(0)
        self._stop_send = None
        thread, self._thread = self._thread, None
        if thread is None:
            return True
        thread.join(STOP_JOIN_S)
        return not thread.is_alive()

    def _serve(self, zap: zmq.Socket, stop_recv: zmq.Socket) -> None:
        poller = zmq.Poller()
        poller.register(zap, zmq.POLLIN)
        poller.register(stop_recv, zmq.POLLIN)
        try:
            while True:
                events = dict(poller.poll())
                if stop_recv in events:
                    return
                if zap in events:
                    zap.send_multipart(self._answer(zap.recv_multipart()))
        except zmq.ContextTerminated:
            return
        finally:
            zap.close(0)
            stop_recv.close(0)

    def _answer(self, frames: list[bytes]) -> list[bytes]:
        """RFC 27's reply to one request: version, request id, status code and text, user id, metadata."""
        if len(frames) < 6 or frames[0] != ZAP_VERSION:
            self._log.debug("DENIED malformed ZAP request (%d frames)", len(frames))
            request_id = frames[1] if len(frames) > 1 else b""
            return [ZAP_VERSION, request_id, b"400", b"Malformed request", b"", b""]
        _version, request_id, domain, _address, _identity, mechanism, *credentials = frames
        if mechanism == b"CURVE" and len(credentials) == 1 and len(credentials[0]) == 32:
            key = z85.encode(credentials[0])
            where = domain.decode(errors="replace") or "*"  # libzmq's default domain is empty
            if key in self._allowed:
                self._log.debug("ALLOWED (CURVE) domain=%s client_key=%s", where, key)
                return [ZAP_VERSION, request_id, b"200", b"OK", key, b""]
            self._log.debug("DENIED (CURVE) domain=%s client_key=%s", where, key)
            return [ZAP_VERSION, request_id, b"400", b"Unknown key", b"", b""]
        self._log.debug("DENIED (%s) mechanism not allowed", mechanism.decode(errors="replace"))
        return [ZAP_VERSION, request_id, b"400", b"Mechanism not allowed", b"", b""]
