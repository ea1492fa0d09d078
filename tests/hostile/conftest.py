"""The attacks of issue 12, each performed for real: real server processes, real sockets,
loops bounded in count and time. Shared helpers come from the other test directories."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS / "integration"))  # runtime_proc: the runtime as users start it
sys.path.insert(0, str(TESTS / "ipc"))  # ipc_fakes, fake_process: the fake-engine server


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
