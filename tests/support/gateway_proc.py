"""Start `edge gateway` as systemd would (READY over sd_notify) on a free loopback port."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from edge.system.readiness import NotifiedProcess, NotReady

GATEWAY_DEADLINE_S = 30.0


class Gateway(NotifiedProcess):
    """``edge gateway --listen 127.0.0.1:0`` in front of ``address``; ``url`` once READY."""

    def __init__(self, workdir: Path, address: str, args: tuple[str, ...]) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "edge.gateway.main", "--connect", address, "--listen", "127.0.0.1:0", *args]
        super().__init__(cmd, notify_path=workdir / "gateway-notify.sock", log_path=workdir / "gateway.log",
                         env={**os.environ})
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
        return took

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


def start_gateway(workdir: Path, address: str, *args: str) -> Gateway:
    gw = Gateway(workdir, address, args)
    try:
        gw.wait_ready()
    except BaseException:
        gw.stop()
        raise
    return gw
