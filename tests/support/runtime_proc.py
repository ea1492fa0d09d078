"""Start the runtime as users run it (`python -m edge.boot`) and watch its notify socket."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from edge.system.readiness import NotifiedProcess, NotReady

BOOT_DEADLINE_S = 120.0  # torch import alone takes seconds on this machine


def runtime_address(workdir: Path) -> str:
    """Where the runtime of ``workdir`` binds: known before it starts (a client may come first)."""
    return f"ipc://{workdir}/run/edge.sock"


class Runtime(NotifiedProcess):
    """The runtime bound at ``address`` (an ipc socket in ``workdir``), output in ``workdir/runtime.log``.
    ``env`` adds to the test's environment; a value of None removes that variable."""

    def __init__(self, workdir: Path, args: tuple[str, ...], env: dict | None = None,
                 wrap: list[str] | None = None) -> None:
        self.workdir = workdir
        self.address = runtime_address(workdir)
        cmd = [*(wrap or []), sys.executable, "-m", "edge.boot", "--bind", self.address,
               "--timeline", str(workdir / "timeline.json"), *args]
        full_env = {**os.environ, "HOME": str(workdir), **(env or {})}
        super().__init__(cmd, notify_path=workdir / "notify.sock", log_path=workdir / "runtime.log",
                         env={k: v for k, v in full_env.items() if v is not None})

    def wait_ready(self, deadline_s: float = BOOT_DEADLINE_S) -> None:
        """READY=1 within ``deadline_s`` of the start, else an AssertionError with the output."""
        try:
            super().wait_ready(deadline_s)
        except NotReady as exc:
            raise AssertionError(f"runtime {exc}") from None

    def output(self, tail: int | None = None) -> str:
        return super().output(tail)


def start_runtime(workdir: Path, *args: str, env: dict | None = None, wrap: list[str] | None = None) -> Runtime:
    """Start `edge serve` with a NOTIFY_SOCKET the test listens on; does not wait. ``wrap``: a
    command that execs the runtime (e.g. ``prlimit --nofile=1024:8192 --``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    return Runtime(workdir, args, env, wrap)


@contextmanager
def running_runtime(workdir: Path, *args: str, env: dict | None = None) -> Iterator[Runtime]:
    """A runtime started and READY for the block, stopped after it: a module fixture's whole life."""
    rt = start_runtime(workdir, *args, env=env)
    try:
        rt.wait_ready()
        yield rt
    finally:
        rt.stop()
