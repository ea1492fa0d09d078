"""The serving socket: a ZeroMQ ROUTER and the I/O thread that owns it.

Data flows one way (after vLLM v1's engine core: sockets belong to the I/O thread, the
engine to one loop; docs/design.md, "Ownership")::

    client -> ROUTER -> I/O thread: validate, reserve -> tokenizer stage -> Admit -> engine loop
           <- ROUTER <- I/O thread: encode, send <- outbox + wake pipe <- engine loop

Tokenizing has a thread of its own (``edge/serving/tokenize_stage.py``). A request is tied to its
connection (``edge/ipc/connections.py``, which also caps the connections held). The I/O thread blocks when idle.

The I/O thread owns the socket, the lifecycle state and the table of requests in flight. A reply to an infer
request is sent only by popping the request from that table, so every accepted request gets exactly one reply,
whatever races with cancel, deadlines or a drain timeout. Other threads talk to the I/O thread through one
pipe: a byte written there wakes it to read the serving core's outbox, start draining or become ready.

A drain (SIGTERM) keeps reading: every message gets its answer (an infer SHUTTING_DOWN) while the requests
in flight finish. Once none is left, the socket file goes and the socket is read to the end before it
closes (``edge/ipc/drain.py``), so no message the socket holds goes down with it unanswered.
"""

from __future__ import annotations

import contextlib
import enum
import os
import threading
import time
from typing import Any, Callable

import zmq

from edge.errors import EdgeError, ErrorCode
from edge.ipc import protocol as P
from edge.ipc.connections import UNKNOWN_CONN, Connections, connection_cap
from edge.ipc.drain import FinalReads, read_to_the_end
from edge.ipc.replies import Peer, health_reply, peer_address, result_frames, split_envelope, stats_reply
from edge.ipc.endpoint import (bind_router, default_bind_address, ipc_path, prepare_ipc_path, remove_ipc_file,
                               take_over_ipc_file)
from edge.ipc.validate import parse_request
from edge.system.log import debug_enabled, log, log_exception
from edge.serving.core import ServingCore
from edge.serving.request import CancelOutcome, Failed, Finished, Request, phases_ms

__all__ = ["IpcServer", "Lifecycle", "default_bind_address"]


class Lifecycle(enum.Enum):
    BOOTING = "booting"  # bound (maybe started): health says not ready, infer gets NOT_READY
    READY = "ready"  # serving infer requests
    DRAINING = "draining"  # drain requested: infer gets SHUTTING_DOWN, requests in flight finish, then last reads
    STOPPED = "stopped"  # threads ended, sockets closed, ipc file removed


class IpcServer:
    def __init__(self, bind: str, core: ServingCore, lineage: P.Lineage | None = None,
                 timeline: Callable[[], dict] | None = None, drain_timeout_s: float = 10.0, *,
                 limits: P.Limits = P.Limits(), curve: Any = None,  # edge.ipc.curve.ServerCurve, or None
                 max_connections: int | None = None,  # default: connection_cap(the open-files limit)
                 linger_ms: int = 1000) -> None:  # how long replies still queued at close may take (ms)
        if not bind.startswith(("ipc://", "tcp://")):
            raise ValueError(f"bind address must be ipc:// or tcp://, got {bind!r}")
        self.bind_address = bind
        self.address = bind  # the endpoint actually bound (tcp port resolved) after bind()
        self.core = core
        self.metrics = core.metrics
        self.limits = limits
        self.lineage = lineage or P.Lineage(engine=getattr(core.engine, "name", None),
                                            device=getattr(core.engine, "device", None))
        self.timeline = timeline
        self.drain_timeout_s = drain_timeout_s
        self.linger_ms = linger_ms
        self.final_reads = FinalReads()  # the reads to the end before close: bounds (edge/ipc/drain.py)
        self.last_reads: dict | None = None  # what those reads found (read, bytes, ms, cut), once done
        self._curve = curve  # CURVE and its ZAP handler on the router (tcp:// with --keys)
        self.max_connections = max_connections or connection_cap()
        self._conns: Connections | None = None
        self._ctx = zmq.Context()
        self._router: zmq.Socket | None = None
        self._ipc_path: str | None = None
        self._ipc_inode: int | None = None
        self._ipc_lock: int | None = None  # descriptor holding PATH.lock while we serve there
        # Owned by the I/O thread once it runs (before that, by the thread that calls start()).
        self._state = Lifecycle.BOOTING
        self._inflight: dict[tuple, Request] = {}
        self._cancels: dict[int, tuple[Peer, Any]] = {}  # id(peer) -> (peer, request_id): cancels not yet answered
        self._seq = 0
        self._drain_deadline: float | None = None
        # Requests from other threads, read by the I/O thread after a wake-up.
        self._drain_requested = False
        self._ready_requested = False
        self._take_over: str | None = None  # the address to take over (its socket file path)
        self._took_over = threading.Event()
        self._take_over_error: str | None = None
        self._state_changed = threading.Condition()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._io_thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._handlers: dict[str, Callable[[Peer, Any], None]] = {
            "infer": self._on_infer, "cancel": self._on_cancel, "health": self._on_health, "stats": self._on_stats}
        self.extra_stats: Callable[[], dict] | None = None  # more stats fields, no I/O (edge.observability.telemetry sets it)
        self.journal: Any = None  # edge.observability.journal.writer.Journal: every reply is noted there (boot sets it)

    @property
    def state(self) -> Lifecycle:
        return self._state

    # ------------------------------------------------------------ lifecycle (any thread)

    def bind(self) -> None:
        """Create the socket directory (0750) if needed, bind, make the ipc file 0660."""
        router = self._ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, self.linger_ms)
        # Frames over this are not even read: libzmq disconnects the peer. Between
        # limits.max_frame_bytes and this, the peer gets FRAME_TOO_LARGE. libzmq holds every
        # frame of a message until its last arrives: 41 of these are 166 MiB.
        router.setsockopt(zmq.MAXMSGSIZE, self.limits.max_frame_bytes + (64 << 10))
        # A client that connects and never greets holds a descriptor this long at most (ms).
        router.setsockopt(zmq.HANDSHAKE_IVL, 5000)
        # A reply to a peer that is gone, or whose queue is full, fails loudly (EHOSTUNREACH,
        # EAGAIN with NOBLOCK) instead of vanishing, so it is counted as dropped.
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        try:
            if self._curve is not None:  # before bind: no connection may skip the ZAP check
                self._curve.apply(router, self._ctx)
            self._ipc_path = ipc_path(self.bind_address)
            if self._ipc_path:
                self._ipc_lock = prepare_ipc_path(self._ipc_path)
            self._conns = Connections(router, self._ipc_path, self.max_connections)  # before bind: sees them all
            self.address, self._ipc_inode = bind_router(router, self.bind_address)
            self._conns.inode = self._ipc_inode
        except Exception:
            if self._conns is not None:
                self._conns.close()
            router.close(0)
            self._release_lock()
            raise
        self._router = router

    def start(self, ready: bool = True) -> None:
        """Start the engine loop and the I/O thread. ``ready=False`` keeps BOOTING until :meth:`mark_ready`."""
        if self._router is None:
            self.bind()
        # Ready before the I/O thread reads its first message: requests that clients queued
        # before bind must be served, not told NOT_READY. No other thread runs yet.
        if ready:
            self._state = Lifecycle.READY
        self.core.start(wake=self._wake)
        self._io_thread = threading.Thread(target=self._io_main, name="edge-ipc-io", daemon=True)
        self._io_thread.start()

    def mark_ready(self, timeout_s: float = 5.0) -> bool:
        """Ask the I/O thread to leave BOOTING; True once it has."""
        self._ready_requested = True
        self._wake()
        return self._wait_state(lambda s: s is not Lifecycle.BOOTING, timeout_s)

    def take_over(self, address: str, timeout_s: float = 5.0) -> None:
        """Move our ipc socket file over ``address``, another server's (a handover: docs/update.md,
        "Beside the old runtime"): from now on new connections come here, while the old server
        keeps and answers its own until it drains. On the I/O thread, which owns the file's
        other moves (parking). Raises OSError when it could not, and the address stays the other's."""
        live = ipc_path(address)
        if live is None or self._ipc_path is None:
            raise OSError(f"only an ipc:// server takes over an ipc:// address, not {address!r}")
        self._take_over = live
        if self._io_thread is None:
            self._take_over_now()
        else:
            self._wake()
            if not self._took_over.wait(timeout_s):
                raise OSError(f"the I/O thread did not take over {address} within {timeout_s:g} s")
        if self._take_over_error is not None:
            raise OSError(self._take_over_error)

    @property
    def handed_over(self) -> bool:
        """True once another server took our address over (seen when the drain removes the file)."""
        return self._conns is not None and self._conns.handed_over

    def _take_over_now(self) -> None:
        live, self._take_over = self._take_over, None
        assert live is not None and self._ipc_path is not None and self._ipc_inode is not None
        try:
            take_over_ipc_file(self._ipc_path, self._ipc_inode, live)
        except OSError as exc:
            self._take_over_error = f"cannot take over {live}: {exc}"
        else:
            log("ipc.took_over", address=f"ipc://{live}", own=self._ipc_path)
            self._ipc_path = live
            self._bound()[1].moved(live)
            self.address = f"ipc://{live}"
        self._took_over.set()

    def request_drain(self, timeout_s: float = 5.0) -> bool:
        """Stop taking infer requests, finish those in flight, then stop; True once the I/O
        thread refuses new requests (it alone changes the state)."""
        self._drain_requested = True
        self._wake()
        if self._io_thread is None:
            return True
        return self._wait_state(lambda s: s in (Lifecycle.DRAINING, Lifecycle.STOPPED), timeout_s)

    def wait(self, timeout_s: float | None = None) -> bool:
        """True once drained and stopped (sockets closed, ipc file removed)."""
        if self._io_thread is None:  # never started: nothing in flight, and no other owner
            if self._drain_requested:
                self._close()
            return self._stopped.is_set()
        self._io_thread.join(timeout_s)
        return self._stopped.is_set()

    def _release_lock(self) -> None:
        if self._ipc_lock is not None:
            os.close(self._ipc_lock)  # the lock file stays: removing it would race the next server's open
            self._ipc_lock = None

    def _wake(self) -> None:
        """Thread-safe: have the I/O thread look at the outbox and the requests above."""
        with contextlib.suppress(OSError):  # pipe full (a wake-up is pending anyway) or already closed
            os.write(self._wake_w, b"w")

    def _wait_state(self, done: Callable[[Lifecycle], bool], timeout_s: float) -> bool:
        with self._state_changed:
            return self._state_changed.wait_for(lambda: done(self._state), timeout_s)

    def _set_state(self, state: Lifecycle) -> None:
        with self._state_changed:
            self._state = state
            self._state_changed.notify_all()

    def _close(self) -> None:
        if self._stopped.is_set():
            return
        loop_done = self.core.stop(2.0)
        if self._conns is not None:  # puts a parked socket file back, for the removal below
            self._conns.close()
        if self._router is not None:
            self._router.close(self.linger_ms)  # queued replies may leave for this long (term() waits for them)
        zap_done = self._curve is None or self._curve.stop()  # its ZAP socket would hold up term()
        if loop_done and zap_done:  # an engine stuck in run(), or the ZAP thread, would hold up term()
            self._ctx.term()
        if self._ipc_path and self._ipc_inode is not None:
            remove_ipc_file(self._ipc_path, self._ipc_inode)
        self._release_lock()
        fds, self._wake_r, self._wake_w = (self._wake_r, self._wake_w), -1, -1
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._set_state(Lifecycle.STOPPED)
        self._stopped.set()

    # ------------------------------------------------------------ I/O thread

    def _bound(self) -> tuple[zmq.Socket, Connections]:
        """The router and its connections: bind() made them, and start() binds before the I/O thread runs."""
        assert self._router is not None and self._conns is not None
        return self._router, self._conns

    def _io_main(self) -> None:
        router, conns = self._bound()
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        poller.register(conns.monitor, zmq.POLLIN)
        try:
            while True:
                timeout: int | None = None  # block until a message, a result or a request from another thread
                if self._drain_deadline is not None:  # ms, whole (as pyzmq would truncate a float)
                    timeout = int(max(0.0, (self._drain_deadline - time.monotonic()) * 1000.0))
                events = dict(poller.poll(timeout))
                conns.update()  # first: connections opened before their messages were sent
                if self._wake_r in events:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                    self._on_wake()
                if router in events:
                    for _ in range(256):  # then look at results again
                        try:
                            frames = router.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        self._on_message(frames)
                        conns.update()
                if self._drain_deadline is not None and self._drained():
                    break
            self._last_reads()
        except Exception:
            log_exception("ipc.io_thread_failed", level="error")
        finally:
            self._close()

    def _on_wake(self) -> None:
        if self._take_over is not None:
            self._take_over_now()
        if self._ready_requested and self._state is Lifecycle.BOOTING:
            self._set_state(Lifecycle.READY)
        if self._drain_requested and self._drain_deadline is None:
            self._set_state(Lifecycle.DRAINING)
            self._drain_deadline = time.monotonic() + self.drain_timeout_s
        self._send_results()

    def _drained(self) -> bool:
        """While draining: True once nothing is in flight (cancels included), or the drain timeout
        answered the rest."""
        self._send_results()
        if not self._inflight and not self._cancels:
            return True
        assert self._drain_deadline is not None  # set when the drain began
        if time.monotonic() < self._drain_deadline:
            return False
        log("shutdown.drain_timeout", level="warning", unfinished=len(self._inflight), answer="SHUTTING_DOWN",
            cancels=len(self._cancels), trace_ids=[r.trace_id for r in self._inflight.values()][:100])
        for request in list(self._inflight.values()):
            self._finish(request, ErrorCode.SHUTTING_DOWN, "server stopped before the request finished")
        cancels, self._cancels = list(self._cancels.values()), {}
        for peer, rid in cancels:  # their targets were answered just above; a late outcome is not sent
            self._cancel_replied(peer, rid, False)
        return True

    def _last_reads(self) -> None:
        """Nothing in flight: take the socket file away, answer every message the socket still
        holds or receives until it falls silent (bounded: edge/ipc/drain.py), then return to close."""
        router, conns = self._bound()
        if not conns.stop_accepting(self._ipc_inode):
            log("shutdown.handed_over", address=self.address)  # the address serves on: another server's now
        self.last_reads = summary = read_to_the_end(router, self._on_message, self.final_reads)
        self._send_results()  # late outcomes of requests answered already: nothing is sent for them
        if summary["read"] or summary["cut"]:  # a quiet stop logs draining, done and nothing between
            log("shutdown.last_reads", level="warning" if summary["left_unread"] else "info", **summary)

    def _send(self, peer: Peer, frames: list, kind: str, code: int = 0, message: str | None = None,
              request_id: Any = None, request: Request | None = None) -> bool:
        """Send one reply without blocking, note it in the journal; False (counted as dropped) if it could not go."""
        drop = self._deliver(peer, frames)
        if self.journal is not None:  # a tuple on a bounded deque: never blocks (edge/observability/journal/writer.py)
            self.journal.note(kind, peer, code, message, request_id, request, drop)
        return drop is None

    def _deliver(self, peer: Peer, frames: list) -> str | None:
        router, conns = self._bound()
        conns.update()  # a DISCONNECTED still unread could hand this reply to the id's next owner
        if not conns.is_open(peer.conn):
            self.metrics.reply_dropped("unroutable")
            return "unroutable"
        envelope = [peer.identity, b""] if peer.delim else [peer.identity]
        try:
            router.send_multipart(envelope + frames, zmq.NOBLOCK)
            return None
        except zmq.ZMQError as exc:  # the peer's queue is full, or it is gone: the reply is dropped, never the server
            reason = "hwm" if exc.errno == zmq.EAGAIN else "unroutable"
            self.metrics.reply_dropped(reason)
            if debug_enabled():
                log("reply.dropped", level="debug", trace_id=peer.trace_id, reason=reason)
            return reason

    def _send_error(self, peer: Peer, code: ErrorCode, message: str, request_id: Any = None, kind: str = "infer",
                    request: Request | None = None) -> None:
        if debug_enabled():
            log("reply.error", level="debug", trace_id=peer.trace_id, code=int(code), message=message)
        frames = P.encode_error(code, message, peer.trace_id, peer.encoding, request_id)
        if self._send(peer, frames, kind, int(code), message, request_id, request):
            self.metrics.error(code)

    def _on_message(self, frames: list[zmq.Frame]) -> None:
        last = frames[-1]
        address = peer_address(last)
        conn = self._bound()[1].conn_of(last.get(zmq.SRCFD), address if self._ipc_path else None)
        peer, rest = split_envelope(frames, conn, address, self.journal.sample_bytes if self.journal else 0)
        try:
            mtype, msg = parse_request(rest, self.limits)
        except P.ProtocolError as exc:
            self.metrics.received("invalid")
            self._send_error(peer, exc.code, exc.message, exc.request_id, "invalid")
            return
        self.metrics.received(mtype)
        if conn == UNKNOWN_CONN:  # sent on a connection that has closed since: no one to do it for
            return self.metrics.reply_dropped("unroutable")
        try:
            self._handlers[mtype](peer, msg)
        except EdgeError as exc:
            self._send_error(peer, exc.code, exc.message, getattr(msg, "request_id", None), mtype)
        except Exception as exc:  # never let one message take the server down
            log_exception("ipc.handler_failed", level="error", type=mtype, trace_id=peer.trace_id)
            self._send_error(peer, ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}"[:300],
                             getattr(msg, "request_id", None), mtype)

    def _on_infer(self, peer: Peer, msg: P.InferMsg) -> None:
        arrival = peer.received  # read from the socket: decoding and validating count in its time
        rid = msg.request_id
        if self._state is Lifecycle.BOOTING:
            return self._send_error(peer, ErrorCode.NOT_READY, "server is still booting", rid)
        if self._state is not Lifecycle.READY:
            return self._send_error(peer, ErrorCode.SHUTTING_DOWN, "server is shutting down", rid)
        if rid is None:
            self._seq += 1
            key: tuple[int, int, int | str] = (peer.conn, 1, self._seq)
        else:
            key = (peer.conn, 0, rid)
            if key in self._inflight:
                return self._send_error(peer, ErrorCode.DUPLICATE_REQUEST_ID,
                                        f"request_id {rid!r} is already in flight", rid)
        deadline = arrival + msg.deadline_ms / 1000.0 if msg.deadline_ms is not None else None
        request = self.core.admit(msg.texts, msg.truncate, arrival, text_bytes=msg.text_bytes, deadline=deadline,
                                  priority=msg.priority, reply_to=peer, trace_id=peer.trace_id, request_id=rid,
                                  key=key)
        self._inflight[key] = request  # raises nothing: admit() was the last step that could

    def _on_cancel(self, peer: Peer, msg: P.CancelMsg) -> None:
        target = self._inflight.get((peer.conn, 0, msg.request_id))
        if target is None:
            return self._send_error(peer, ErrorCode.UNKNOWN_REQUEST_ID,
                                    f"no request {msg.request_id!r} in flight on this connection", msg.request_id,
                                    "cancel")
        self._cancels[id(peer)] = (peer, msg.request_id)  # answered once: by its outcome or the drain timeout
        self.core.cancel(target, peer)

    def _on_health(self, peer: Peer, msg: P.HealthMsg) -> None:
        reply = health_reply(self, peer, self._state is Lifecycle.READY, len(self._inflight))
        if self._send(peer, reply.frames(peer.encoding), "health"):
            self.metrics.replied("health")

    def _on_stats(self, peer: Peer, msg: P.StatsMsg) -> None:
        reply = stats_reply(self, peer, len(self._inflight), self._bound()[1].info())
        if self._send(peer, reply.frames(peer.encoding), "stats"):
            self.metrics.replied("stats")

    # ------------------------------------------------------------ results

    def _send_results(self) -> None:
        outbox = self.core.outbox
        while outbox:
            message = outbox.popleft()
            try:
                if isinstance(message, Finished):
                    self._finish(message.request)
                elif isinstance(message, Failed):
                    self._finish(message.request, message.code, message.message)
                elif isinstance(message, CancelOutcome) and self._cancels.pop(id(message.reply_to), None) is not None:
                    self._cancel_replied(message.reply_to, message.target.request_id, message.cancelled)
            except Exception:
                log_exception("ipc.send_failed", level="error", type=type(message).__name__,
                              trace_id=getattr(getattr(message, "request", None), "trace_id", None))

    def _cancel_replied(self, peer: Peer, request_id: Any, cancelled: bool) -> None:
        reply = P.CancelReply(request_id, cancelled, peer.trace_id)
        if self._send(peer, reply.frames(peer.encoding), "cancel", request_id=reply.request_id):
            self.metrics.replied("cancel")

    def _finish(self, request: Request, code: ErrorCode | None = None, message: str = "") -> None:
        """Answer an infer request, once: only the caller that pops it from the table replies."""
        if self._inflight.get(request.key) is not request:
            return
        del self._inflight[request.key]
        self.core.release(request)
        peer: Peer = request.reply_to
        if code is None:
            try:
                frames = result_frames(request, peer, self.lineage, self.core.fallback)
            except Exception as exc:  # e.g. an engine output that cannot be encoded
                log_exception("ipc.encode_failed", level="error", trace_id=request.trace_id)
                code, message = ErrorCode.INTERNAL, f"encoding the result failed: {type(exc).__name__}"
        if code is not None:
            return self._send_error(peer, code, message, request.request_id, "infer", request)
        total_ms = ((now := time.monotonic()) - request.arrival) * 1000.0
        if debug_enabled():
            log("reply.result", level="debug", trace_id=request.trace_id, texts=request.texts,
                queue_ms=round(request.queue_ms, 3), compute_ms=round(request.compute_ms, 3),
                total_ms=round(total_ms, 3))
        if self._send(peer, frames, "infer", 0, None, request.request_id, request):
            phases = phases_ms(request.arrival, request.enqueued, request.done, request.compute_ms, now)[:4]
            self.metrics.replied("infer", request.queue_ms, total_ms, phases)
