"""Plain connections held open beyond the soft open-files limit the runtime was started with."""

from __future__ import annotations

import socket
import time

from edge.ipc.client import EdgeClient

from runtime_proc import start_runtime


def _limits(pid: int) -> tuple[int, int]:
    for line in open(f"/proc/{pid}/limits"):
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open-files line")


def test_more_connections_than_the_inherited_soft_limit_do_not_end_the_runtime(minilm_package, tmp_path):
    """Started with soft 1,024 (systemd's default), hard 8,192: 3,000 held connections, then a client."""
    rt = start_runtime(tmp_path, "--package", str(minilm_package),
                       wrap=["prlimit", "--nofile=1024:8192", "--"])
    held: list[socket.socket] = []
    try:
        rt.wait_ready()
        assert _limits(rt.pid) == (8192, 8192)  # raised to the hard limit at boot
        path = rt.address[len("ipc://"):]
        for _ in range(3000):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            held.append(s)
        time.sleep(0.5)  # libzmq accepts them on its own thread; give it time to (not) abort
        assert rt.proc.poll() is None, rt.output()
        for s in held:
            s.close()
        held.clear()
        t0 = time.monotonic()
        with EdgeClient(rt.address, timeout_s=5) as client:
            assert client.embed(["after the flood"]).embeddings.shape == (1, 384)
        assert time.monotonic() - t0 < 1.0
    finally:
        for s in held:
            s.close()
        rt.stop()
