"""An asyncio client of the serving socket: a small pool of DEALER connections, many
requests in flight on each, replies matched by ``request_id``.

For the HTTP gateway (``edge/gateway/``), which serves many HTTP requests at once from one
event loop: concurrency must not serialize on one socket, so every ``infer`` carries a
request id unique in this process and a reader task per connection hands each reply to the
request waiting for it. A request that times out is forgotten (its late reply, if any, is
dropped by its id), so no connection needs the lazy-pirate reset of ``EdgeClient``.

``health`` and ``stats`` carry no request id on the wire, so they travel on a connection of
their own, one at a time, and that connection is reopened after a timeout.

A ``SHUTTING_DOWN`` reply comes from a runtime that is going (an update's handover: the new
runtime holds the address already): the connection it came on is replaced by a new one, closed
once the replies it still waits for have come, and an ``infer`` is sent again, once, on the
pool as it is then. The control connection is reopened.

Never imported by the boot path: it pulls in asyncio and ``zmq.asyncio``.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

import numpy as np
import zmq
import zmq.asyncio

from edge.errors import ErrorCode
from edge.ipc import protocol as P
from edge.ipc.client import raise_for_error

__all__ = ["AsyncEdgePool", "PoolResult", "Unreachable", "CONNECT_GRACE_S"]

# How long a send that finds no completed connection waits for one before Unreachable (s). Without
# it, the first requests after the gateway's READY met a connect still under way, and after the
# runtime restarts, ZeroMQ reconnects only at its next attempt (every 100 ms plus up to 100 ms of
# jitter): a runtime ready and bound was answered 503 for up to 0.2 s. When the runtime is down,
# this is what a 503 waits.
CONNECT_GRACE_S = 0.5


class Unreachable(ConnectionError):
    """No connection to the runtime takes the request now (not started, or gone)."""


@dataclass
class PoolResult:
    embeddings: np.ndarray  # (N, D) float32
    meta: dict = field(default_factory=dict)  # the reply body: trace_id, token_counts, ...


async def _send(sock: zmq.asyncio.Socket, frames: list, address: str) -> None:
    """Send now, or once a connection completes within CONNECT_GRACE_S; else Unreachable."""
    try:
        await sock.send_multipart(frames, flags=zmq.NOBLOCK)
        return
    except zmq.Again:
        pass
    # IMMEDIATE: writable once a connection is complete. pyzmq types the asyncio socket's poll as
    # its poller's (no flags); the socket's own poll takes them (zmq/_future.py).
    if await sock.poll(CONNECT_GRACE_S * 1000, zmq.POLLOUT):  # type: ignore[call-arg]
        try:
            await sock.send_multipart(frames, flags=zmq.NOBLOCK)
            return
        except zmq.Again:
            pass
    raise Unreachable(f"no connection to the runtime at {address}")


class _Conn:
    """One DEALER connection and the requests in flight on it (``request_id`` -> future)."""

    def __init__(self, ctx: zmq.asyncio.Context, address: str, curve=None) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        # IMMEDIATE: queue only on a completed connection, so a send with no runtime there fails
        # at once (Unreachable -> 503) instead of waiting in a pipe for a peer that may never come.
        self.sock.setsockopt(zmq.IMMEDIATE, 1)
        if curve is not None:
            curve.apply(self.sock)
        self.sock.connect(address)
        self.waiting: dict[int, asyncio.Future] = {}
        self.reader: asyncio.Task | None = None
        self.retired = False  # replaced in the pool: closed once nothing waits on it
        self.closed = False

    async def read(self) -> None:
        while True:
            frames = await self.sock.recv_multipart(copy=True)
            try:
                reply = P.decode_reply(frames)
            except ValueError:
                continue
            fut = self.waiting.pop(reply.body.get("request_id"), None)  # type: ignore[arg-type]
            if fut is not None and not fut.done():
                fut.set_result(reply)
            if self.retired:
                self.close_when_idle()
                if self.closed:
                    return  # its socket is gone: nothing more to read

    def close_when_idle(self) -> None:
        """A retired connection: closed (reader and socket) once no request waits on it. A request
        whose reply never comes ends by its own timeout, which pops it; the pool's close ends the rest."""
        if self.waiting or self.closed:
            return
        self.closed = True
        if self.reader is not None and self.reader is not asyncio.current_task():
            self.reader.cancel()
        self.sock.close(0)


class AsyncEdgePool:
    """``size`` DEALER connections to ``address``; ``embed`` picks the least busy one."""

    def __init__(self, address: str, size: int = 4, *, curve=None) -> None:
        self.address = address
        self.size = size
        self.curve = curve
        self._ctx = zmq.asyncio.Context()
        # zmq.asyncio reports a NOBLOCK send's EAGAIN on the send's future: every send is awaited.
        self._conns: list[_Conn] = []
        self._retiring: list[_Conn] = []  # replaced after a SHUTTING_DOWN, still owed replies
        self._ids = itertools.count(1)
        self._control: zmq.asyncio.Socket | None = None
        self._control_lock: asyncio.Lock | None = None

    def start(self) -> None:
        """Open the connections and their reader tasks (inside the running loop)."""
        for _ in range(self.size):
            c = _Conn(self._ctx, self.address, self.curve)
            c.reader = asyncio.get_running_loop().create_task(c.read())
            self._conns.append(c)
        self._control_lock = asyncio.Lock()
        self._open_control()

    def _open_control(self) -> None:
        if self._control is not None:
            self._control.close(0)
        s = self._ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.IMMEDIATE, 1)
        if self.curve is not None:
            self.curve.apply(s)
        s.connect(self.address)
        self._control = s

    def in_flight(self) -> int:
        return sum(len(c.waiting) for c in self._conns)

    async def embed(self, texts: list[str], *, deadline_ms: float, truncate: bool | None = None,
                    grace_s: float = 1.0) -> PoolResult:
        """Embed ``texts`` (one runtime request); waits ``deadline_ms`` + ``grace_s`` at most.

        Raises the runtime's EdgeError (``trace_id`` set), ``Unreachable``, or TimeoutError."""
        reply = await self._infer(texts, deadline_ms, truncate, grace_s)
        if reply.is_error and reply.body.get("code") == ErrorCode.SHUTTING_DOWN:
            # That runtime is going and did not run it: after an update's handover the new one holds
            # the address already, and a connection made now reaches it. Once, on one.
            reply = await self._infer(texts, deadline_ms, truncate, grace_s)
        raise_for_error(reply)
        b = reply.body
        return PoolResult(P.embeddings_from_frame(reply.extra[0], b["count"], b["dim"]), b)

    async def _infer(self, texts: list[str], deadline_ms: float, truncate: bool | None, grace_s: float) -> P.Reply:
        """One infer request on the least busy connection; a SHUTTING_DOWN reply retires that
        connection (:meth:`_retire`) before it is returned."""
        conn = min(self._conns, key=lambda c: len(c.waiting))
        rid = next(self._ids)
        body: dict = {"texts": texts, "request_id": rid, "deadline_ms": deadline_ms}
        if truncate is not None:
            body["truncate"] = truncate
        fut = asyncio.get_running_loop().create_future()
        conn.waiting[rid] = fut
        try:
            await _send(conn.sock, P.encode_request("infer", body), self.address)
            reply = await asyncio.wait_for(fut, deadline_ms / 1000.0 + grace_s)
        finally:
            conn.waiting.pop(rid, None)
            if conn.retired:
                conn.close_when_idle()
        if reply.is_error and reply.body.get("code") == ErrorCode.SHUTTING_DOWN:
            self._retire(conn)
        return reply

    def _retire(self, conn: _Conn) -> None:
        """Replace ``conn`` by a new connection to the address; ``conn`` takes no new request and is
        closed once the replies it waits for have come (the draining runtime still sends them)."""
        if conn not in self._conns:
            return  # another request's SHUTTING_DOWN retired it already
        fresh = _Conn(self._ctx, self.address, self.curve)
        fresh.reader = asyncio.get_running_loop().create_task(fresh.read())
        self._conns[self._conns.index(conn)] = fresh
        self._retiring = [c for c in self._retiring if not c.closed] + [conn]
        conn.retired = True
        conn.close_when_idle()

    async def control(self, mtype: str, timeout_s: float) -> dict:
        """``health`` or ``stats``, one at a time on the control connection; error replies raised."""
        assert self._control_lock is not None
        async with self._control_lock:
            assert self._control is not None
            await _send(self._control, P.encode_request(mtype, {}), self.address)
            try:
                frames = await asyncio.wait_for(self._control.recv_multipart(), timeout_s)
            except asyncio.TimeoutError:
                self._open_control()  # a late reply must not answer the next request
                raise TimeoutError(f"no {mtype} reply from {self.address} within {timeout_s:g} s") from None
            reply = P.decode_reply(frames)
            if reply.is_error and reply.body.get("code") == ErrorCode.SHUTTING_DOWN:
                self._open_control()  # the next one connects to whichever runtime holds the address then
        return raise_for_error(reply).body

    def close(self) -> None:
        for c in self._conns + self._retiring:
            if c.reader is not None:
                c.reader.cancel()
            for fut in c.waiting.values():
                if not fut.done():
                    fut.cancel()
            if not c.closed:
                c.sock.close(0)
        self._conns.clear()
        self._retiring.clear()
        if self._control is not None:
            self._control.close(0)
            self._control = None
        self._ctx.term()
