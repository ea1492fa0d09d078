"""The serving socket: a ZeroMQ ROUTER, its I/O thread, and the engine loop thread.

Data flows one way (STYLE.md, after vLLM v1's engine core)::

    client -> ROUTER -> I/O thread: decode, validate, tokenize, admit -> EngineLoop.submit
           <- ROUTER <- I/O thread: encode, send <- outbox + inproc PAIR wake-up <- engine loop

The I/O thread owns both sockets and the table of requests in flight; a reply
for an infer request is sent only by popping its entry from that table, so
every accepted request gets exactly one reply, whatever races with cancel,
deadlines or a drain timeout. The engine loop owns the engine and the
scheduler. Both threads block when idle.
"""

from __future__ import annotations

import enum
import os
import threading
import time
from typing import Any, Callable

import numpy as np
import zmq

from edge.errors import EdgeError, ErrorCode
from edge.log import log, log_exception
from edge.ipc import protocol as P
from edge.ipc.admission import Admission
from edge.ipc.endpoint import default_bind_address, ipc_path, prepare_ipc_path, remove_ipc_file
from edge.ipc.engine_loop import EngineLoop, allocate_buffers
from edge.ipc.stats import Metrics
from edge.scheduler import BucketScheduler, Job

__all__ = ["IpcServer", "Lifecycle", "default_bind_address", "DEFAULT_SERVING"]


# Used for settings the package does not give (docs/architecture.md, "serving").
DEFAULT_SERVING = {
    "buckets": [16, 32, 64, 128, 256],  # tokens
    "max_batch_size": 32,  # texts per batch
    "max_batch_tokens": 8192,  # padded tokens per batch (rows x bucket)
    "max_delay_ms": 2.0,  # longest wait for a batch to fill once the engine is busy (ms)
    "max_queue_requests": 1024,  # texts admitted and not yet answered
    "max_queue_tokens": 262144,  # padded tokens (bucket lengths) admitted and not yet answered
    "batch_sizes": None,  # warmed batch sizes; batches are padded up to the next one
}


class Lifecycle(enum.Enum):
    BOOTING = "booting"  # bound (maybe started): health says not ready, infer gets NOT_READY
    READY = "ready"  # serving infer requests
    DRAINING = "draining"  # drain requested: infer gets SHUTTING_DOWN, requests in flight finish
    STOPPED = "stopped"  # threads ended, sockets closed, ipc file removed


def _setting(serving: Any, name: str) -> Any:
    if serving is None:
        return DEFAULT_SERVING[name]
    value = serving.get(name) if isinstance(serving, dict) else getattr(serving, name, None)
    return DEFAULT_SERVING[name] if value is None else value


class _Peer:
    """Where and how to answer one message."""

    __slots__ = ("identity", "delim", "encoding", "trace_id", "key", "request_id", "tokens", "buckets", "truncated", "cost")

    def __init__(self, identity: bytes, delim: bool, encoding: str, trace_id: str) -> None:
        self.identity, self.delim, self.encoding, self.trace_id = identity, delim, encoding, trace_id
        self.key = self.request_id = None  # set for an admitted infer, and for a cancel
        self.tokens = self.buckets = self.truncated = None  # per text, from the Admission
        self.cost = 0  # padded tokens counted against max_queue_tokens


class IpcServer:
    def __init__(
        self,
        bind: str,
        engine: Any,
        tokenizer: Any,
        serving: Any = None,
        max_seq_length: int = 256,
        lineage: dict | None = None,
        input_buffers: dict | None = None,
        timeline: Callable[[], dict] | None = None,
        drain_timeout_s: float = 10.0,
        *,
        limits: P.Limits = P.Limits(),
        default_deadline_ms: float = 30_000.0,  # ordering key of requests without a deadline (ms)
        linger_ms: int = 1000,  # how long replies still queued at close may take to leave (ms)
        # Round each batch up to the next serving.batch_sizes entry, so the engine only sees shapes
        # warm-up ran (CUDA graphs, TensorRT profiles). None: only on a CUDA device; a CPU gains nothing.
        pad_to_warmed_batch: bool | None = None,
    ) -> None:
        if not bind.startswith(("ipc://", "tcp://")):
            raise ValueError(f"bind address must be ipc:// or tcp://, got {bind!r}")
        self.bind_address = bind
        self.address = bind  # the endpoint actually bound (tcp port resolved) after bind()
        self.engine, self.tokenizer, self.limits = engine, tokenizer, limits
        self.lineage = dict(lineage or {})
        self.lineage.setdefault("engine", getattr(engine, "name", None))
        self.lineage.setdefault("device", getattr(engine, "device", None))
        self.timeline = timeline
        self.drain_timeout_s = drain_timeout_s
        self.linger_ms = linger_ms
        buckets = [int(b) for b in _setting(serving, "buckets")]
        rows = {b: input_buffers[b][0].shape[0] for b in buckets if input_buffers and b in input_buffers}
        self.scheduler = BucketScheduler(
            buckets,
            int(_setting(serving, "max_batch_size")),
            int(_setting(serving, "max_batch_tokens")),
            float(_setting(serving, "max_delay_ms")),
            default_deadline_ms=default_deadline_ms,
            rows=rows,
        )
        buffers = allocate_buffers({b: c for b, c in self.scheduler.caps.items() if b not in rows})
        buffers.update({b: input_buffers[b] for b in rows})
        self.max_tokens = min(int(max_seq_length), max(buckets))  # texts are truncated (or refused) beyond it
        self.admission = Admission(  # I/O thread only
            tokenizer, buckets, self.max_tokens,
            int(_setting(serving, "max_queue_requests")), int(_setting(serving, "max_queue_tokens")),
        )
        self.metrics = Metrics(buckets)
        if pad_to_warmed_batch is None:
            pad_to_warmed_batch = str(getattr(engine, "device", "cpu")).startswith("cuda")
        self._ctx = zmq.Context()
        self._wake_endpoint = f"inproc://edge-replies-{id(self):x}"
        self.loop = EngineLoop(
            engine, self.scheduler, pad_id=getattr(tokenizer, "pad_id", 0), buffers=buffers, metrics=self.metrics,
            wake_endpoint=self._wake_endpoint, context=self._ctx, warmed_batch_sizes=_setting(serving, "batch_sizes") if pad_to_warmed_batch else None,
        )
        self._state = Lifecycle.BOOTING
        self._router: zmq.Socket | None = None
        self._pair: zmq.Socket | None = None
        self._ipc_path: str | None = None
        self._ipc_inode: int | None = None
        self._inflight: dict[tuple, Job] = {}  # I/O thread only
        self._seq = 0
        self._drain_requested = False
        self._drain_deadline: float | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._io_thread: threading.Thread | None = None
        self._loop_thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._handlers = {"infer": self._on_infer, "cancel": self._on_cancel, "health": self._on_health, "stats": self._on_stats}

    @property
    def state(self) -> Lifecycle:
        return self._state

    # ------------------------------------------------------------ lifecycle

    def bind(self) -> None:
        """Create the socket directory (0750) if needed, bind, make the ipc file 0660."""
        router = self._ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, self.linger_ms)
        # Frames over this are not even read: libzmq disconnects the peer. Between
        # limits.max_frame_bytes and this, the peer gets FRAME_TOO_LARGE.
        router.setsockopt(zmq.MAXMSGSIZE, 4 * self.limits.max_frame_bytes)
        try:
            self._ipc_path = ipc_path(self.bind_address)
            if self._ipc_path:
                prepare_ipc_path(self._ipc_path)
            router.bind(self.bind_address)
            self.address = router.getsockopt_string(zmq.LAST_ENDPOINT)
            if self._ipc_path:
                os.chmod(self._ipc_path, 0o660)
                self._ipc_inode = os.stat(self._ipc_path).st_ino
        except Exception:
            router.close(0)
            raise
        self._router = router
        self._pair = self._ctx.socket(zmq.PAIR)
        self._pair.setsockopt(zmq.LINGER, 0)
        self._pair.bind(self._wake_endpoint)

    def start(self, ready: bool = True) -> None:
        """Start the I/O and engine threads. ``ready=False`` keeps BOOTING until :meth:`mark_ready`."""
        if self._router is None:
            self.bind()
        self._loop_thread = threading.Thread(target=self.loop.run, name="edge-engine-loop", daemon=True)
        self._io_thread = threading.Thread(target=self._io_main, name="edge-ipc-io", daemon=True)
        # Ready before the I/O thread reads its first message: requests that
        # clients queued before bind must be served, not told NOT_READY.
        if ready:
            self.mark_ready()
        self._loop_thread.start()
        self._io_thread.start()

    def mark_ready(self) -> None:
        if self._state is Lifecycle.BOOTING:
            self._state = Lifecycle.READY

    def request_drain(self) -> None:
        """Thread- and signal-safe: stop taking infer requests, finish those in flight, then stop."""
        self._drain_requested = True
        if self._state in (Lifecycle.BOOTING, Lifecycle.READY):
            self._state = Lifecycle.DRAINING
        try:
            if self._wake_w >= 0:
                os.write(self._wake_w, b"d")
        except OSError:  # pipe full (a wake-up is pending anyway) or already closed
            pass

    def wait(self, timeout_s: float | None = None) -> bool:
        """True once drained and stopped (sockets closed, ipc file removed)."""
        if self._io_thread is None:  # never started: nothing in flight
            if self._drain_requested:
                self._close()
            return self._stopped.is_set()
        self._io_thread.join(timeout_s)
        return self._stopped.is_set()

    def _close(self) -> None:
        if self._stopped.is_set():
            return
        self.loop.stop()
        if self._router is not None:
            self._router.close()  # LINGER lets queued replies leave
        if self._pair is not None:
            self._pair.close(0)
        loop_done = True
        if self._loop_thread is not None:
            self._loop_thread.join(2.0)
            loop_done = not self._loop_thread.is_alive()
        if loop_done:  # an engine stuck in run() keeps its socket open; term() would hang
            self._ctx.term()
        if self._ipc_path and self._ipc_inode is not None:
            remove_ipc_file(self._ipc_path, self._ipc_inode)
        fds, self._wake_r, self._wake_w = (self._wake_r, self._wake_w), -1, -1
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._state = Lifecycle.STOPPED
        self._stopped.set()

    # ------------------------------------------------------------ I/O thread

    def _io_main(self) -> None:
        router, pair = self._router, self._pair
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(pair, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        try:
            while True:
                timeout = None  # block until a message, a result or a drain request
                if self._drain_deadline is not None:
                    timeout = max(0.0, (self._drain_deadline - time.monotonic()) * 1000.0)
                events = dict(poller.poll(timeout))
                if self._wake_r in events:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                if self._drain_requested and self._drain_deadline is None:
                    self._state = Lifecycle.DRAINING
                    self._drain_deadline = time.monotonic() + self.drain_timeout_s
                if pair in events:
                    self._send_results()
                if router in events:
                    for _ in range(256):  # then look at results again
                        try:
                            frames = router.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._on_message(frames)
                if self._drain_deadline is not None:
                    self._send_results()
                    if not self._inflight:
                        break
                    if time.monotonic() >= self._drain_deadline:
                        log("shutdown.drain_timeout", unfinished=len(self._inflight), answer="SHUTTING_DOWN")
                        for job in list(self._inflight.values()):
                            self._finish(job, ErrorCode.SHUTTING_DOWN, "server stopped before the request finished")
                        break
        except Exception:
            log_exception("ipc.io_thread_failed")
        finally:
            self._close()

    def _send(self, peer: _Peer, frames: list) -> None:
        envelope = [peer.identity, b""] if peer.delim else [peer.identity]
        try:
            self._router.send_multipart(envelope + frames)
        except zmq.ZMQError:  # peer gone or its queue full: the reply is dropped, never the server
            self.metrics.reply_dropped()

    def _send_error(self, peer: _Peer, code: ErrorCode, message: str, request_id: Any = None) -> None:
        self.metrics.error(code)
        self._send(peer, P.encode_error(code, message, peer.trace_id, peer.encoding, request_id))

    def _on_message(self, frames: list) -> None:
        identity, rest = frames[0], frames[1:]
        delim = bool(rest) and len(rest[0]) == 0  # REQ sockets put an empty delimiter first
        if delim:
            rest = rest[1:]
        peer = _Peer(identity, delim, P.sniff_encoding(rest[0]) if rest else P.MSGPACK, os.urandom(8).hex())
        try:
            mtype, msg = P.parse_request(rest, self.limits)
        except P.ProtocolError as exc:
            self.metrics.received("invalid")
            self._send_error(peer, exc.code, exc.message, exc.request_id)
            return
        self.metrics.received(mtype)
        try:
            self._handlers[mtype](peer, msg)
        except EdgeError as exc:
            self._send_error(peer, exc.code, exc.message, getattr(msg, "request_id", None))
        except Exception as exc:  # never let one message take the server down
            log_exception("ipc.handler_failed", type=mtype)
            self._send_error(peer, ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}"[:300], getattr(msg, "request_id", None))

    def _on_infer(self, peer: _Peer, msg: P.InferMsg) -> None:
        arrival = time.monotonic()
        rid = msg.request_id
        if self._state is Lifecycle.BOOTING:
            return self._send_error(peer, ErrorCode.NOT_READY, "server is still booting", rid)
        if self._state is not Lifecycle.READY:
            return self._send_error(peer, ErrorCode.SHUTTING_DOWN, "server is shutting down", rid)
        if rid is None:
            self._seq += 1
            key = (peer.identity, 1, self._seq)
        else:
            key = (peer.identity, 0, rid)
            if key in self._inflight:
                return self._send_error(peer, ErrorCode.DUPLICATE_REQUEST_ID, f"request_id {rid!r} is already in flight", rid)
        t = self.admission.tokenize(msg.texts, msg.truncate)  # raises TOO_MANY_TOKENS
        deadline = arrival + msg.deadline_ms / 1000.0 if msg.deadline_ms is not None else None
        job = Job(t.ids, t.buckets, arrival, deadline=deadline, priority=msg.priority, ctx=peer)
        self.admission.admit(t)  # raises OVERLOADED; nothing after it can fail
        peer.tokens, peer.buckets, peer.truncated, peer.cost = t.tokens, t.buckets, t.truncated, t.cost
        peer.key, peer.request_id = key, rid
        self._inflight[key] = job
        self.metrics.accepted(len(t.ids))
        self.loop.submit(("add", job))

    def _on_cancel(self, peer: _Peer, msg: P.CancelMsg) -> None:
        job = self._inflight.get((peer.identity, 0, msg.request_id))
        if job is None:
            return self._send_error(peer, ErrorCode.UNKNOWN_REQUEST_ID, f"no request {msg.request_id!r} in flight on this connection", msg.request_id)
        peer.request_id = msg.request_id
        self.loop.submit(("cancel", job, peer))

    def _queue_info(self) -> dict:
        return {**self.admission.info(), "in_flight": len(self._inflight)}

    def _on_health(self, peer: _Peer, msg: P.HealthMsg) -> None:
        body = {
            "live": True, "ready": self._state is Lifecycle.READY, "state": self._state.value,
            "uptime_s": round(time.monotonic() - self.metrics.started, 3), "queue": self._queue_info(),
            "trace_id": peer.trace_id,
        }
        self.metrics.replied("health")
        self._send(peer, P.encode_reply("health", body, peer.encoding))

    def _on_stats(self, peer: _Peer, msg: P.StatsMsg) -> None:
        body = self.metrics.snapshot()
        body.update(state=self._state.value, queue=self._queue_info(), lineage=self.lineage, trace_id=peer.trace_id)
        body["settings"] = {
            "buckets": self.scheduler.buckets, "batch_caps": {str(b): c for b, c in self.scheduler.caps.items()},
            "max_delay_ms": self.scheduler.max_delay * 1000.0, "max_tokens": self.max_tokens,
            "max_texts": self.limits.max_texts, "max_text_bytes": self.limits.max_text_bytes,
            "max_frame_bytes": self.limits.max_frame_bytes,
        }
        try:
            body["timeline"] = self.timeline() if self.timeline else None
        except Exception as exc:
            body["timeline"] = {"error": f"{type(exc).__name__}: {exc}"}
        self.metrics.replied("stats")
        self._send(peer, P.encode_reply("stats", body, peer.encoding))

    # ------------------------------------------------------------ results

    def _send_results(self) -> None:
        try:
            while True:
                self._pair.recv(zmq.NOBLOCK)
        except zmq.Again:
            pass
        outbox = self.loop.outbox
        while outbox:
            item = outbox.popleft()
            try:
                if item[0] == "done":
                    self._finish(item[1])
                elif item[0] == "error":
                    self._finish(item[1], item[2], item[3])
                elif item[0] == "cancel":
                    peer, cancelled = item[1], item[3]
                    self.metrics.replied("cancel")
                    body = {"request_id": peer.request_id, "cancelled": cancelled, "trace_id": peer.trace_id}
                    self._send(peer, P.encode_reply("cancel", body, peer.encoding))
            except Exception:
                log_exception("ipc.send_failed", type=item[0])

    def _finish(self, job: Job, code: ErrorCode | None = None, message: str = "") -> None:
        """Answer an infer request, once: only the caller that pops it from the table replies."""
        peer: _Peer = job.ctx
        if self._inflight.get(peer.key) is not job:
            return
        del self._inflight[peer.key]
        self.admission.release(len(job.parts), peer.cost)
        if code is None:
            try:
                frames = self._result_frames(job, peer)
            except Exception as exc:  # e.g. an engine output that cannot be encoded
                log_exception("ipc.encode_failed")
                code, message = ErrorCode.INTERNAL, f"encoding the result failed: {type(exc).__name__}"
        if code is not None:
            return self._send_error(peer, code, message, peer.request_id)
        self.metrics.replied("infer", job.queue_ms, (time.monotonic() - job.arrival) * 1000.0)
        self._send(peer, frames)

    def _result_frames(self, job: Job, peer: _Peer) -> list:
        out = np.ascontiguousarray(job.out, dtype=P.EMBEDDING_DTYPE)  # (N, D) little-endian float32
        body = {
            "trace_id": peer.trace_id, "count": out.shape[0], "dim": out.shape[1],
            "token_counts": peer.tokens, "buckets": peer.buckets, "truncated": peer.truncated,
            "queue_ms": round(job.queue_ms, 3), "compute_ms": round(job.compute_ms, 3),
            **{k: self.lineage.get(k) for k in ("model_sha256", "tokenizer_sha256", "package_sha256", "engine", "device")},
        }
        if peer.request_id is not None:
            body["request_id"] = peer.request_id
        return P.encode_reply("infer", body, peer.encoding, (out.data,))
