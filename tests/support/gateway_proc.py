"""Start `edge gateway` as systemd would (READY over sd_notify) on a free port."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import sys
from pathlib import Path

from edge.system.readiness import NotifiedProcess, NotReady

GATEWAY_DEADLINE_S = 30.0


class Gateway(NotifiedProcess):
    """``edge gateway --listen LISTEN`` (default 127.0.0.1:0) in front of ``address``; ``url`` once
    READY, with ``host`` in it where given (a listener on 0.0.0.0 is reached at one of the
    machine's addresses)."""

    def __init__(self, workdir: Path, address: str, args: tuple[str, ...], listen: str = "127.0.0.1:0",
                 host: str | None = None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "edge.gateway.main", "--connect", address, "--listen", listen, *args]
        super().__init__(cmd, notify_path=workdir / "gateway-notify.sock", log_path=workdir / "gateway.log",
                         env={**os.environ})
        self.host = host
        self.url = ""

    def wait_ready(self, deadline_s: float = GATEWAY_DEADLINE_S) -> float:  # type: ignore[override]
        try:
            took = super().wait_ready(deadline_s)
        except NotReady as exc:
            raise AssertionError(f"gateway {exc}") from None
        for line in self.output(None).splitlines():
            if '"gateway.ready"' in line:
                self.url = json.loads(line)["listen"]
        assert self.url, self.output()
        if self.host is not None:
            scheme, rest = self.url.split("://", 1)
            self.url = f"{scheme}://{self.host}:{rest.rsplit(':', 1)[1]}"
        return took

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


def start_gateway(workdir: Path, address: str, *args: str, listen: str = "127.0.0.1:0",
                  host: str | None = None) -> Gateway:
    gw = Gateway(workdir, address, args, listen, host)
    try:
        gw.wait_ready()
    except BaseException:
        gw.stop()
        raise
    return gw


def exposed_host() -> str | None:
    """This machine's IPv4 address on the interface of its default route (nothing is sent: a UDP
    socket's connect only picks the route), or None where it has no such non-loopback address."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("203.0.113.1", 9))  # TEST-NET-3: never routed anywhere real
        except OSError:
            return None
        host = s.getsockname()[0]
    return None if ipaddress.ip_address(host).is_loopback or host == "0.0.0.0" else host
