"""Start the runtime as users run it (`python -m edge.boot`) and watch its notify socket."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BOOT_DEADLINE_S = 120.0  # torch import alone takes seconds on this machine


@dataclass
class Runtime:
    proc: subprocess.Popen
    address: str
    workdir: Path
    notify: socket.socket
    notices: list[bytes] = field(default_factory=list)
    stdout_path: Path | None = None

    def wait_ready(self, deadline_s: float = BOOT_DEADLINE_S) -> None:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"runtime exited {self.proc.returncode} before READY:\n{self.output()}")
            try:
                self.notices.append(self.notify.recv(4096))
            except socket.timeout:
                continue
            if any(b"READY=1" in n.split(b"\n") for n in self.notices):
                return
        raise AssertionError(f"no READY=1 within {deadline_s} s:\n{self.output()}")

    def output(self) -> str:
        return self.stdout_path.read_text(errors="replace") if self.stdout_path else ""

    def stop(self, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.notify.close()
        return self.proc.returncode


def start_runtime(workdir: Path, *args: str, env: dict | None = None) -> Runtime:
    """Start `edge serve` with a NOTIFY_SOCKET the test listens on; does not wait."""
    workdir.mkdir(parents=True, exist_ok=True)
    notify_path = workdir / "notify.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.settimeout(0.2)
    address = f"ipc://{workdir}/run/edge.sock"
    stdout_path = workdir / "runtime.log"
    full_env = {**os.environ, "NOTIFY_SOCKET": str(notify_path), "HOME": str(workdir), **(env or {})}
    cmd = [sys.executable, "-m", "edge.boot", "--bind", address, "--timeline", str(workdir / "timeline.json"), *args]
    with open(stdout_path, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env)
    return Runtime(proc, address, workdir, notify, stdout_path=stdout_path)


