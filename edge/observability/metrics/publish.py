"""Where the Prometheus metrics go: a text file for node_exporter, an HTTP listener, or both.

``edge serve --metrics-textfile DIR`` writes ``DIR/edge.prom`` every ``--metrics-interval``
seconds and once more at shutdown; ``--metrics-listen HOST:PORT`` serves ``GET /metrics``
(docs/metrics.md). Both start after READY, on threads of their own: nothing here runs on the
serving path. The text is rendered by :mod:`edge.observability.metrics.export` at most once per
``min(RENDER_INTERVAL_S, --metrics-interval)``, and every scrape and file write in between is
served from that render (:mod:`edge.observability.metrics.cache`). The listener (:mod:`edge.observability.metrics.http`)
is bounded by the ``LISTEN_*`` limits below: connections at once, one deadline per
connection from accept to the reply sent, and accepts per second.

Before READY the boot only checks (:func:`check_metrics_export`) that ``prometheus_client`` is
installed and the directory writable, without importing either module.
"""

from __future__ import annotations

import errno
import os
import threading
from typing import TYPE_CHECKING, Any, Callable

from edge.errors import BootError, ErrorCode

if TYPE_CHECKING:
    from edge.observability.metrics.http import MetricsListener

__all__ = ["MetricsPublisher", "check_metrics_export", "start_metrics", "wanted", "write_textfile", "TEXTFILE_NAME"]

TEXTFILE_NAME = "edge.prom"
# The listener's limits (edge/observability/metrics/http.py, docs/metrics.md Limits)
LISTEN_CLIENTS = 4  # scrapes served at once; a connection beyond them is closed unanswered
LISTEN_TIMEOUT_S = 5.0  # a connection's whole time, accept to the reply sent; then it is closed (s)
LISTEN_HEAD_GRACE_S = 1.0  # still sending its request head after this long: its slot goes to a newcomer (s)
LISTEN_ACCEPTS_PER_S = 20.0  # connections accepted a second (bursts of LISTEN_CLIENTS); the rest wait
RENDER_INTERVAL_S = 1.0  # a scrape's text is at most this old (s), or --metrics-interval when shorter
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
        from edge.observability.metrics.cache import Exposition

        self.registry = registry
        self.exposition = Exposition(registry, min(RENDER_INTERVAL_S, interval_s))  # the file's and the scrapes'
        self.textfile_dir = textfile_dir
        self.interval_s = interval_s
        self.address: tuple[str, int] | None = None  # bound (host, port), port resolved
        self._stop = threading.Event()
        self._writer: threading.Thread | None = None
        self._http: MetricsListener | None = None
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
        if self._http is not None:
            self._http.stop()
            self._http = None
        if self._writer is not None:
            self._writer.join(2.0)
            if final_write:
                self.write(fresh=True)

    # ------------------------------------------------------------ textfile

    def write(self, fresh: bool = False) -> bool:
        """Write the file from the last render, or a new one when it is older than the interval
        (``fresh``: a new one in any case)."""
        from edge.system.log import log

        assert self.textfile_dir is not None  # the textfile writer's: start() runs it only with a directory
        try:
            path = write_textfile(self.textfile_dir, self.exposition.text(fresh=fresh))
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
        from edge.observability.metrics.http import MetricsListener

        self._http = MetricsListener(host, port, self.exposition, clients=LISTEN_CLIENTS, timeout_s=LISTEN_TIMEOUT_S,
                                     head_grace_s=LISTEN_HEAD_GRACE_S, accepts_per_s=LISTEN_ACCEPTS_PER_S)
        self.address = self._http.address
        self._http.start()


def start_metrics(args, server: Any, telemetry: Callable[[], dict | None] | None = None, *,
                  listen_wait_s: float = 0.0) -> MetricsPublisher | None:
    """After READY: the publisher ``args`` asks for, started; None when no flag asks.

    A failure here (the listen port is taken) is logged and the runtime serves on: READY is
    already sent, and metrics are not worth a restart loop. The textfile still goes out."""
    if not wanted(args):
        return None
    from edge.system.log import log, log_exception

    try:
        from edge.observability.metrics.export import registry_for
        from edge.config.argtypes import parse_listen

        publisher = MetricsPublisher(registry_for(server, telemetry), textfile_dir=args.metrics_textfile,
                                     interval_s=args.metrics_interval)
        publisher.start()
    except Exception:
        log_exception("metrics.start_failed", level="error")
        return None
    fields: dict[str, Any] = {
        "textfile": os.path.join(args.metrics_textfile, TEXTFILE_NAME) if args.metrics_textfile else None}
    if args.metrics_listen:
        try:
            publisher.start_listener(*parse_listen(args.metrics_listen))
            assert publisher.address is not None  # start_listener bound it
            host, port = publisher.address
            fields["listen"] = f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE and listen_wait_s > 0:
                _listen_later(publisher, args.metrics_listen, listen_wait_s)
            else:
                log("metrics.listen_failed", level="error", listen=args.metrics_listen, error=str(exc),
                    setting="--metrics-listen HOST:PORT")
    log("metrics.started", interval_s=args.metrics_interval, **fields)
    return publisher


def _listen_later(publisher: MetricsPublisher, listen: str, wait_s: float) -> None:
    """Bind the listener once the port is free, within ``wait_s``, on a thread: the runtime this one
    replaces (restored beside it) holds the port until it has drained."""
    import time

    from edge.config.argtypes import parse_listen
    from edge.system.log import log

    def run() -> None:
        give_up = time.monotonic() + wait_s
        while not publisher._stop.wait(0.1):
            try:
                publisher.start_listener(*parse_listen(listen))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or time.monotonic() >= give_up:
                    log("metrics.listen_failed", level="error", listen=listen, error=str(exc),
                        setting="--metrics-listen HOST:PORT")
                    return
                continue
            log("metrics.listening", listen=listen, waited_s=round(wait_s - (give_up - time.monotonic()), 3))
            return

    threading.Thread(target=run, name="edge-metrics-listen", daemon=True).start()
