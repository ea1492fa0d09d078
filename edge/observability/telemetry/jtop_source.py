"""jetson-stats' jtop service as an optional source (``pip install 'edge[jetson]'``).

jetson-stats is AGPL-3.0 and a separate service (``jtop.service``, socket /run/jtop.sock)
that runs as root and reads what an unprivileged runtime may not (EMC load, the engines,
fans). edge never depends on it: the package is imported only when installed, and used only
when its socket exists and accepts a connection within ``connect_timeout_s``; its client
starts on a thread of its own, given ``start_timeout_s`` to deliver. Anything else (not
installed, no socket, service down, a client that fails or hangs) leaves the sysfs readings
alone, with the reason in ``status``, and is tried again after ``retry_s``.

All of this runs on the sampler's thread; no request ever waits on jtop.
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import socket
import threading
import time

from edge.observability.telemetry.sysfs import shown

__all__ = ["JtopSource", "JTOP_SOCKET", "plain"]

JTOP_SOCKET = "run/jtop.sock"  # under the root: jetson-stats 4's service socket


def plain(value):
    """``value`` as something msgpack and JSON carry: numbers, strings, None, lists and str-keyed dicts."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, datetime.datetime):
        return value.timestamp()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return str(value)


class JtopSource:
    """jtop's ``stats`` (a flat dict: CPU1.., RAM, GPU, EMC, Temp *, Power *, nvp model, ...)."""

    def __init__(self, root: str = "/", connect_timeout_s: float = 0.2, start_timeout_s: float = 3.0,
                 retry_s: float = 60.0, module: str = "jtop") -> None:
        self.root = root
        self.socket_path = os.path.join(root, JTOP_SOCKET)
        self.connect_timeout_s = connect_timeout_s  # the service must accept a connection this fast (s)
        self.start_timeout_s = start_timeout_s  # and its client deliver within this (s)
        self.retry_s = retry_s  # after a failure, wait this long before trying again (s)
        self.module = module
        self.status = "not tried yet"
        self._client = None
        self._next_try = 0.0

    def read(self) -> dict | None:
        """jtop's stats, or None with the reason in :attr:`status`."""
        if self._client is None:
            if time.monotonic() < self._next_try:
                return None
            self._client = self._connect()
            if self._client is None:
                self._next_try = time.monotonic() + self.retry_s
                return None
        try:
            if not self._client.is_alive():
                raise RuntimeError("the jtop client stopped")
            stats = plain(self._client.stats)
        except Exception as exc:  # a service that went away, or any error of the client
            self._fail(f"jtop stopped answering: {type(exc).__name__}: {exc}"[:200])
            return None
        self.status = "ok"
        return stats

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:
                pass

    def _fail(self, why: str) -> None:
        self.close()
        self.status = why
        self._next_try = time.monotonic() + self.retry_s

    def _connect(self):
        """A started jtop client, or None with the reason in :attr:`status`."""
        try:
            installed = importlib.util.find_spec(self.module) is not None
        except (ImportError, ValueError):
            installed = False
        if not installed:
            self.status = "jetson-stats is not installed (pip install 'edge[jetson]')"
            return None
        where = shown(self.root, self.socket_path)
        if not os.path.exists(self.socket_path):
            self.status = f"no {where}: the jtop service is not running (or not mounted in the bundle)"
            return None
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(self.connect_timeout_s)
        try:
            probe.connect(self.socket_path)
        except OSError as exc:
            self.status = f"{where} does not answer: {exc.strerror or type(exc).__name__}"
            return None
        finally:
            probe.close()
        return self._start_client()

    def _start_client(self):
        """jtop's client, started on a thread of its own so a hung start cannot hold the sampler."""
        box: dict = {}
        lock = threading.Lock()

        def start() -> None:
            try:
                client = importlib.import_module(self.module).jtop()
                client.start()
                result = ("client", client)
            except Exception as exc:
                client, result = None, ("error", f"{type(exc).__name__}: {exc}"[:200])
            with lock:
                box.setdefault(*result)
                abandoned = box.get("abandoned")
            if abandoned and client is not None:  # started after the sampler gave up on it
                self._close_quietly(client)

        thread = threading.Thread(target=start, name="edge-telemetry-jtop", daemon=True)
        thread.start()
        thread.join(self.start_timeout_s)
        with lock:
            if "client" not in box and "error" not in box:
                box["abandoned"] = True
                self.status = f"the jtop client did not start within {self.start_timeout_s:g} s"
                return None
        if "error" in box:
            self.status = f"the jtop client failed to start: {box['error']}"
            return None
        return box["client"]

    @staticmethod
    def _close_quietly(client) -> None:
        try:
            client.close()
        except Exception:
            pass
