"""The fake-engine server (tests/support/serve_fake.py) as a real process, and a polling helper."""

from __future__ import annotations

import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import time

from support.pythonpath import TESTS, child_env

ROOT = str(TESTS.parent)
CLK_TCK = os.sysconf("SC_CLK_TCK")
READY_DEADLINE_S = 30.0


def first_line_within(fd: int, timeout_s: float) -> tuple[str | None, bytes, bool]:
    """(the first line written to pipe ``fd`` or None, all the bytes read, whether the pipe was
    closed before a line ended); None without EOF: no line within ``timeout_s``. Reads the pipe
    itself: nothing may have been read from its file object before."""
    out = b""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while b"\n" not in out:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                return None, out, False
            chunk = os.read(fd, 65536)
            if not chunk:
                return None, out, True
            out += chunk
    return out.split(b"\n", 1)[0].decode(errors="replace"), out, False


def wait_until(condition, timeout_s: float, what: str):
    """Poll ``condition()`` until it is true; AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}"
        time.sleep(0.005)  # poll interval


class ServerProcess:
    def __init__(self, *args: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="edge-proc-", dir="/tmp")
        self.path = f"{self.dir}/run/edge.sock"
        self.address = f"ipc://{self.path}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "support.serve_fake", "--bind", self.address, *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=child_env(),
        )
        line, out, closed = first_line_within(self.proc.stdout.fileno(), READY_DEADLINE_S)
        if line is None or not line.startswith("READY"):
            if line is not None:
                why = f"its first line is {line!r}"
            else:
                why = "it closed stdout (exited?)" if closed else f"no line within {READY_DEADLINE_S:.0f} s"
            self.kill()  # a hung child too: its stderr can then be read to the end
            raise RuntimeError(f"server did not print READY: {why} (exit code {self.proc.returncode})\n"
                               f"stdout: {out[-2000:].decode(errors='replace')}\n"
                               f"stderr: {self.proc.stderr.read()[-4000:]}")

    def rss_kib(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

    def cpu_s(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime, all threads

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)
