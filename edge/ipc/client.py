"""A synchronous client of the serving socket, with timeouts.

One DEALER socket per client. A request that times out closes the socket and
opens a new one (the ZeroMQ guide's "lazy pirate" pattern), so a late reply can
never be mistaken for the answer to the next request. For pipelining (several
requests in flight, cancel), use :meth:`EdgeClient.send` and :meth:`EdgeClient.recv`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from edge.errors import EdgeError, ErrorCode, error_class_for
from edge.ipc import protocol as P

__all__ = ["EdgeClient", "EmbedResult", "raise_for_error"]


@dataclass
class EmbedResult:
    embeddings: np.ndarray  # (N, D) float32
    meta: dict = field(default_factory=dict)  # the reply body: trace_id, token_counts, buckets, ...


def raise_for_error(reply: P.Reply) -> P.Reply:
    """Raise the EdgeError subclass of an error reply (with ``trace_id`` set); return other replies."""
    if reply.is_error:
        b = reply.body
        code: Any = b.get("code")  # off the wire: an int from a well-formed server, ErrorCode() checks it
        try:
            code = ErrorCode(code)
        except ValueError:
            exc = EdgeError(f"[{code} {b.get('name')}] {b.get('message')}")
        else:
            exc = error_class_for(code)(str(b.get("message")), code)
        exc.trace_id = b.get("trace_id")  # type: ignore[attr-defined]
        exc.request_id = b.get("request_id")  # type: ignore[attr-defined]
        raise exc
    return reply


class EdgeClient:
    def __init__(self, connect: str | None = None, timeout_s: float = 5.0, encoding: str = P.MSGPACK,
                 context: zmq.Context | None = None, *, curve=None) -> None:
        """``curve``: an :class:`edge.ipc.curve.ClientCurve` (``ClientCurve.load(server_key_file,
        client_key_file)``) for a tcp:// server started with ``--keys``."""
        from edge.ipc.endpoint import default_address, normalize_address

        self.address = normalize_address(connect) if connect is not None else default_address()
        self.timeout_s = timeout_s
        self.encoding = encoding
        self.curve = curve
        self._ctx = context or zmq.Context.instance()
        self._sock: zmq.Socket | None = None
        self._open()

    def _open(self) -> None:
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        if self.curve is not None:
            self.curve.apply(self._sock)
        self._sock.connect(self.address)

    def reset(self) -> None:
        """Drop the connection (and any reply still on its way) and open a new one."""
        if self._sock is not None:
            self._sock.close(0)
        self._open()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None

    def __enter__(self) -> "EdgeClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ raw

    def _socket(self) -> zmq.Socket:
        """The connection's socket: None only after close(), when the client is not to be used."""
        assert self._sock is not None, "the client is closed"
        return self._sock

    def send(self, mtype: str, body: dict) -> None:
        self._socket().send_multipart(P.encode_request(mtype, body, self.encoding))

    def send_frames(self, frames: list) -> None:
        self._socket().send_multipart(frames)

    def recv(self, timeout_s: float | None = None) -> P.Reply:
        """The next reply on this connection; TimeoutError when none arrives in time."""
        t = self.timeout_s if timeout_s is None else timeout_s
        sock = self._socket()
        if not sock.poll(int(t * 1000), zmq.POLLIN):
            raise TimeoutError(f"no reply from {self.address} within {t:g} s")
        return P.decode_reply(sock.recv_multipart())

    def request(self, mtype: str, body: dict, timeout_s: float | None = None) -> P.Reply:
        """Send one request and wait for its reply; error replies are raised as EdgeError."""
        self.send(mtype, body)
        try:
            reply = self.recv(timeout_s)
        except TimeoutError:
            self.reset()
            raise
        if reply.is_error and reply.body.get("code") == ErrorCode.SHUTTING_DOWN:
            # This server is going. The next request connects again, to whichever server holds the
            # address by then: after an update's handover the new runtime serves there already.
            self.reset()
        return raise_for_error(reply)

    # ------------------------------------------------------------ typed

    def embed(
        self,
        texts: list[str] | str,
        *,
        request_id: str | int | None = None,
        deadline_ms: float | None = None,
        priority: int | None = None,
        truncate: bool | None = None,
        timeout_s: float | None = None,
    ) -> EmbedResult:
        body: dict = {"texts": [texts] if isinstance(texts, str) else list(texts)}
        for k, v in (("request_id", request_id), ("deadline_ms", deadline_ms), ("priority", priority), ("truncate", truncate)):
            if v is not None:
                body[k] = v
        reply = self.request("infer", body, timeout_s)
        if len(reply.extra) != 1:
            raise ValueError(f"infer reply has {len(reply.extra)} embedding frames, expected 1")
        emb = P.embeddings_from_frame(reply.extra[0], reply.body["count"], reply.body["dim"])
        return EmbedResult(emb, reply.body)

    def cancel(self, request_id: str | int, timeout_s: float | None = None) -> dict:
        return self.request("cancel", {"request_id": request_id}, timeout_s).body

    def health(self, timeout_s: float | None = None) -> dict:
        return self.request("health", {}, timeout_s).body

    def stats(self, timeout_s: float | None = None) -> dict:
        return self.request("stats", {}, timeout_s).body
