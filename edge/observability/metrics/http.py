"""The HTTP listener of ``--metrics-listen``: ``GET /metrics``, served from the render cache
(:mod:`edge.observability.metrics.cache`), with bounds a client cannot talk its way around (docs/metrics.md,
Limits; the values are :mod:`edge.observability.metrics.publish`'s ``LISTEN_*``):

* ``clients`` connections at once, each on a daemon thread; one more is closed unanswered;
* one request per connection (HTTP/1.0), and ``timeout_s`` for all of it, from accept to the
  last byte of the reply: one deadline across every read and write, so a client that sends
  its head a line at a time, or reads the reply a byte at a time, loses the connection when
  it passes (a timeout per read let 4 of them hold every slot for ever);
* when every slot is taken, a new connection takes the slot of the one that has been sending
  its request head the longest, if that is over ``head_grace_s`` (a scraper sends its head in
  microseconds; slowloris that reconnects at once would otherwise win each freed slot);
* ``accepts_per_s`` connections accepted per second (bursts of ``clients``): the others wait
  in the kernel's listen backlog, which costs the runtime nothing. Scrapers looping as fast as
  they can get that many answers a second, and the runtime spends that many requests' worth
  of Python on them, whatever their number.

The listener's thread blocks while no one connects (no polling, unlike ``serve_forever``).
"""

from __future__ import annotations

import io
import os
import selectors
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, cast

__all__ = ["MetricsListener"]


class _Conn:
    """One accepted connection: its socket, its deadline, whether it is still sending its head."""

    __slots__ = ("sock", "address", "accepted", "deadline", "in_head")

    def __init__(self, sock: socket.socket, address: Any, timeout_s: float) -> None:
        self.sock, self.address = sock, address
        self.accepted = time.monotonic()
        self.deadline = self.accepted + timeout_s
        self.in_head = True


class _DeadlineIO(io.RawIOBase):
    """A connection's reads and writes, each given only the time left before its deadline."""

    def __init__(self, conn: _Conn) -> None:
        super().__init__()
        self.conn = conn

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def _time_left(self) -> None:
        left = self.conn.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the connection's time is over")
        self.conn.sock.settimeout(left)

    def readinto(self, b) -> int:
        self._time_left()
        return self.conn.sock.recv_into(b)

    def write(self, b) -> int:
        self._time_left()
        self.conn.sock.sendall(b)  # one timeout for all of it (Python >= 3.5)
        return len(b)


class _Handler(BaseHTTPRequestHandler):
    """One request (HTTP/1.0: the connection closes after the reply), before the deadline."""

    server: _Server  # the one server that makes these handlers (serve_one), not any BaseServer

    def __init__(self, conn: _Conn, server: "_Server") -> None:
        self.conn = conn
        super().__init__(conn.sock, conn.address, server)

    def setup(self) -> None:  # StreamRequestHandler's, with one deadline for every read and write
        self.connection = self.request
        raw = _DeadlineIO(self.conn)
        # wfile unbuffered, the deadline's writer itself: typeshed wants a BufferedIOBase, and
        # http.server only calls write() and flush(), which RawIOBase has.
        self.rfile, self.wfile = io.BufferedReader(raw), raw  # type: ignore[assignment]

    def parse_request(self) -> bool:  # reads the headers: the head is in once it returns
        try:
            return super().parse_request()
        finally:
            self.server.head_read(self.conn)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.split("?", 1)[0] not in ("/metrics", "/"):
            self.send_error(404, "only /metrics is served here")
            return
        data, content_type, gzipped = self.server.exposition.body(self.headers.get("Accept"),
                                                                  self.headers.get("Accept-Encoding"))
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        if gzipped:
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format, *args) -> None:  # noqa: A002 - http.server's name
        pass  # http.server writes every request to stderr


class _Server(HTTPServer):
    """Accepts on the listener's thread; each connection is served on a thread of its own."""

    def __init__(self, address: tuple[str, int], exposition: Any, clients: int, timeout_s: float,
                 head_grace_s: float) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.exposition = exposition
        self.clients, self.timeout_s, self.head_grace_s = clients, timeout_s, head_grace_s
        self.lock = threading.Lock()  # guards conns, and every shutdown() of another thread's socket
        self.conns: set[_Conn] = set()  # those holding a slot
        # process_request is overridden (serve_one makes each _Handler(conn, self)): TCPServer never
        # calls the class with its (request, address, server), the signature typeshed checks.
        super().__init__(address, _Handler)  # type: ignore[arg-type]

    def process_request(self, request, client_address) -> None:
        conn = _Conn(request, client_address, self.timeout_s)
        with self.lock:
            full = len(self.conns) >= self.clients and not self._evict_slowest_head()
            if not full:
                self.conns.add(conn)
        if full:
            self.shutdown_request(request)  # no slot free: closed unanswered
            return
        try:
            threading.Thread(target=self.serve_one, args=(conn,), name="edge-metrics-scrape", daemon=True).start()
        except RuntimeError:  # no thread to be had
            self.done(conn)

    def _evict_slowest_head(self) -> bool:
        """(Lock held.) Close the connection that has been sending its head the longest, when
        that is over head_grace_s; its slot is then free."""
        heads = [c for c in self.conns if c.in_head and time.monotonic() - c.accepted >= self.head_grace_s]
        if not heads:
            return False
        victim = min(heads, key=lambda c: c.accepted)
        self.conns.discard(victim)
        try:
            victim.sock.shutdown(socket.SHUT_RDWR)  # its thread's read returns: it ends, and closes it
        except OSError:
            pass
        return True

    def head_read(self, conn: _Conn) -> None:
        with self.lock:
            conn.in_head = False

    def serve_one(self, conn: _Conn) -> None:
        try:
            _Handler(conn, self)
        except Exception:
            pass  # a client that went away, or ran out of time, mid-reply
        finally:
            self.done(conn)

    def done(self, conn: _Conn) -> None:
        with self.lock:  # out of conns before the close: no shutdown() reaches a closed socket
            self.conns.discard(conn)
        self.shutdown_request(conn.sock)


class _Pace:
    """A token bucket: ``per_s`` accepts a second, ``burst`` at once."""

    def __init__(self, per_s: float, burst: int) -> None:
        self.per_s, self.burst = per_s, burst
        self.tokens, self.at = float(burst), time.monotonic()

    def delay(self) -> float:
        """Seconds to wait before the next accept (its token is taken now)."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.per_s) - 1
        self.at = now
        return max(0.0, -self.tokens / self.per_s)


class MetricsListener:
    """``GET /metrics`` on ``host:port`` (port 0: the kernel's pick; OSError when it cannot bind)."""

    def __init__(self, host: str, port: int, exposition: Any, *, clients: int, timeout_s: float,
                 head_grace_s: float, accepts_per_s: float) -> None:
        self._httpd = _Server((host, port), exposition, clients, timeout_s, head_grace_s)
        self._httpd.timeout = 0  # handle_request() after select() said a connection waits
        # An AF_INET/AF_INET6 socket's address: (host str, port), then IPv6's flowinfo and scope id.
        self.address = cast("tuple[str, int]", self._httpd.server_address[:2])
        self._pace = _Pace(accepts_per_s, clients)
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="edge-metrics-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        os.write(self._wake_w, b"x")
        self._thread.join(2.0)
        self._httpd.server_close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)

    def _serve(self) -> None:
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(self._httpd.socket, selectors.EVENT_READ)
                sel.register(self._wake_r, selectors.EVENT_READ)
                while not self._stop.is_set():
                    for key, _ in sel.select():
                        if key.fd == self._wake_r:
                            return
                        delay = self._pace.delay()
                        if delay and self._stop.wait(delay):  # over the rate: it waits in the backlog
                            return
                        self._httpd.handle_request()
        except Exception:
            from edge.system.log import log_exception

            log_exception("metrics.listener_failed", level="error")
