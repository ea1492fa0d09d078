"""The attacks of issue 12, each performed for real: real server processes, real sockets,
loops bounded in count and time. Shared helpers (the runtime as users start it, the fake-engine
server) come from tests/support."""

from __future__ import annotations

import shutil
import tempfile

import pytest


@pytest.fixture
def sock_dir():
    # Short path: an AF_UNIX address holds at most 107 bytes.
    d = tempfile.mkdtemp(prefix="edge-hostile-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def proc_status(pid: int, field: str) -> int:
    """A ``kB`` field of /proc/PID/status (VmRSS, VmHWM, ...), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))
