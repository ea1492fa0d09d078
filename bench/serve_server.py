"""The serve benchmark's servers: a subprocess (the runtime, the glue server) bound to an ipc
socket in a work directory, READY=1 from a NOTIFY_SOCKET we bind (``edge.system.readiness``)."""

from __future__ import annotations

import os
from pathlib import Path

from edge.system.readiness import NotifiedProcess, NotReady

__all__ = ["READY_DEADLINE_S", "Server"]

READY_DEADLINE_S = 120.0  # torch import alone takes seconds here


class Server(NotifiedProcess):
    """``cmd --bind ipc://WORKDIR/NAME.sock`` with HOME=WORKDIR, output to WORKDIR/NAME.log."""

    def __init__(self, name: str, cmd: list[str], workdir: Path) -> None:
        self.name, self.workdir = name, workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.address = f"ipc://{workdir}/{name}.sock"
        super().__init__([*cmd, "--bind", self.address], notify_path=workdir / f"{name}-notify.sock",
                         log_path=workdir / f"{name}.log", env={**os.environ, "HOME": str(workdir)})

    def wait_ready(self) -> float:
        """Seconds from start to READY=1 (also ``ready_s``); NotReady naming the server otherwise."""
        try:
            return super().wait_ready(READY_DEADLINE_S)
        except NotReady as exc:
            raise NotReady(f"{self.name} {exc}", exited=exc.exited) from None

    def stats(self) -> dict:
        from edge.ipc.client import EdgeClient

        with EdgeClient(self.address, timeout_s=30) as c:
            return c.stats()
