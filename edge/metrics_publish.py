"""Where the Prometheus metrics go: a text file for node_exporter, an HTTP listener, or both.

``edge serve --metrics-textfile DIR`` writes ``DIR/edge.prom`` every ``--metrics-interval``
seconds and once more at shutdown; ``--metrics-listen HOST:PORT`` serves ``GET /metrics``
(docs/metrics.md). Both start after READY, on threads of their own: nothing here runs on the
serving path, and the text is rendered by :mod:`edge.metrics_export` at the moment it is read.

Before READY the boot only checks (:func:`check_metrics_export`) that ``prometheus_client`` is
installed and the directory writable, without importing either module.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

from edge.errors import BootError, ErrorCode

__all__ = ["MetricsPublisher", "check_metrics_export", "start_metrics", "wanted", "write_textfile", "TEXTFILE_NAME"]

TEXTFILE_NAME = "edge.prom"
LISTEN_CLIENTS = 4  # scrapes served at once; a connection beyond them is closed unanswered
LISTEN_TIMEOUT_S = 5.0  # a client that sends or reads nothing this long loses its connection (s)
MISSING = "prometheus-client is not installed: pip install 'edge[metrics]' (or drop the --metrics-* flags)"


def wanted(args) -> bool:
    return bool(getattr(args, "metrics_textfile", None) or getattr(args, "metrics_listen", None))


def check_metrics_export(args) -> None:
    """Boot stage (only with a --metrics-* flag): what the exporter needs after READY is here."""
    import importlib.util

    if importlib.util.find_spec("prometheus_client") is None:
        raise BootError(MISSING, ErrorCode.METRICS_UNAVAILABLE, setting="--metrics-textfile, --metrics-listen")
    d = args.metrics_textfile
    if d and not (os.path.isdir(d) and os.access(d, os.W_OK | os.X_OK)):
        why = "is not a directory" if not os.path.isdir(d) else "is not writable by this user"
        raise BootError(f"metrics directory {d} {why}", setting="--metrics-textfile DIR")


def write_textfile(directory: str, data: bytes, name: str = TEXTFILE_NAME) -> str:
    """Replace ``directory/name`` with ``data`` atomically: a reader sees the old file or the
    new one, never part of one. The data goes to a new hidden file in the same directory
    (O_EXCL: never an existing name or a planted link; node_exporter reads ``*.prom`` only),
    which a rename puts in place. No fsync: every 15 s on a device's flash, and a file lost to a
    power cut is rewritten at the next boot."""
    import tempfile

    path = os.path.join(directory, name)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), 0o644)  # node_exporter runs as another user
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


class MetricsPublisher:
    """The textfile writer's thread and the HTTP listener's, over one registry."""

    def __init__(self, registry: Any, *, textfile_dir: str | None = None, interval_s: float = 15.0) -> None:
        self.registry = registry
        self.textfile_dir = textfile_dir
        self.interval_s = interval_s
        self.address: tuple[str, int] | None = None  # bound (host, port), port resolved
        self._stop = threading.Event()
        self._writer: threading.Thread | None = None
        self._httpd = None
        self._listener: threading.Thread | None = None
        self._wake_r = self._wake_w = -1
        self._write_error: str | None = None  # the last failure's kind, logged once until a write succeeds

    def start(self) -> None:
        """Write the file now, then every ``interval_s`` (the listener: :meth:`start_listener`)."""
        if self.textfile_dir:
            self.write()
            self._writer = threading.Thread(target=self._write_loop, name="edge-metrics-textfile", daemon=True)
            self._writer.start()

    def stop(self, final_write: bool = True) -> None:
        """Stop both threads; write the file a last time (the state then says draining or stopped)."""
        self._stop.set()
        if self._httpd is not None:
            os.write(self._wake_w, b"x")
            self._listener.join(2.0)
            self._httpd.server_close()
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
            self._httpd = None
        if self._writer is not None:
            self._writer.join(2.0)
            if final_write:
                self.write()

    # ------------------------------------------------------------ textfile

    def write(self) -> bool:
        from edge.log import log
        from edge.metrics_export import render

        try:
            path = write_textfile(self.textfile_dir, render(self.registry))
        except Exception as exc:  # a full disk or a removed directory must not stop the serving
            kind = f"{type(exc).__name__} {getattr(exc, 'errno', '')}"  # the message names a random temp file
            if kind != self._write_error:
                log("metrics.write_failed", level="warning", directory=self.textfile_dir,
                    error=f"{type(exc).__name__}: {exc}")
            self._write_error = kind
            return False
        if self._write_error is not None:
            log("metrics.write_recovered", path=path)
            self._write_error = None
        return True

    def _write_loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.write()

    # ------------------------------------------------------------ HTTP

    def start_listener(self, host: str, port: int) -> None:
        """Bind ``host:port`` (OSError when it cannot) and serve ``GET /metrics`` on a thread."""
        import selectors
        import socket
        from http.server import ThreadingHTTPServer

        from prometheus_client.exposition import MetricsHandler

        registry = self.registry

        class Handler(MetricsHandler):
            timeout = LISTEN_TIMEOUT_S  # StreamRequestHandler: the socket's timeout

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                    self.send_error(404, "only /metrics is served here")
                    return
                super().do_GET()

        Handler.registry = registry

        class Server(ThreadingHTTPServer):
            """At most LISTEN_CLIENTS connections served at once, each on a daemon thread: a
            slow or stuck client costs a thread for LISTEN_TIMEOUT_S, never the serving."""

            daemon_threads = True
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            slots = threading.BoundedSemaphore(LISTEN_CLIENTS)

            def process_request(self, request, client_address) -> None:
                if not self.slots.acquire(blocking=False):
                    self.shutdown_request(request)
                    return
                try:
                    super().process_request(request, client_address)
                except BaseException:
                    self.slots.release()
                    raise

            def process_request_thread(self, request, client_address) -> None:
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    self.slots.release()

            def handle_error(self, request, client_address) -> None:
                pass  # a client that went away mid-reply; http.server would print a traceback

        self._httpd = Server((host, port), Handler)
        self._httpd.timeout = 0  # handle_request() after select() said a connection waits
        self.address = self._httpd.server_address[:2]
        self._wake_r, self._wake_w = os.pipe()

        def serve() -> None:
            # Blocks until a connection or stop() (no polling while idle, unlike serve_forever).
            try:
                with selectors.DefaultSelector() as sel:
                    sel.register(self._httpd.socket, selectors.EVENT_READ)
                    sel.register(self._wake_r, selectors.EVENT_READ)
                    while not self._stop.is_set():
                        for key, _ in sel.select():
                            if key.fd == self._wake_r:
                                return
                            self._httpd.handle_request()
            except Exception:
                from edge.log import log_exception

                log_exception("metrics.listener_failed", level="error")

        self._listener = threading.Thread(target=serve, name="edge-metrics-http", daemon=True)
        self._listener.start()


def start_metrics(args, server: Any, telemetry: Callable[[], dict | None] | None = None) -> MetricsPublisher | None:
    """After READY: the publisher ``args`` asks for, started; None when no flag asks.

    A failure here (the listen port is taken) is logged and the runtime serves on: READY is
    already sent, and metrics are not worth a restart loop. The textfile still goes out."""
    if not wanted(args):
        return None
    from edge.log import log, log_exception

    try:
        from edge.metrics_export import registry_for
        from edge.settings import parse_listen

        publisher = MetricsPublisher(registry_for(server, telemetry), textfile_dir=args.metrics_textfile,
                                     interval_s=args.metrics_interval)
        publisher.start()
    except Exception:
        log_exception("metrics.start_failed", level="error")
        return None
    fields = {"textfile": os.path.join(args.metrics_textfile, TEXTFILE_NAME) if args.metrics_textfile else None}
    if args.metrics_listen:
        try:
            publisher.start_listener(*parse_listen(args.metrics_listen))
            host, port = publisher.address
            fields["listen"] = f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"
        except OSError as exc:
            log("metrics.listen_failed", level="error", listen=args.metrics_listen, error=str(exc),
                setting="--metrics-listen HOST:PORT")
    log("metrics.started", interval_s=args.metrics_interval, **fields)
    return publisher
