"""Connection floods: plain sockets opened and held until libzmq would run out of descriptors.

libzmq's ipc listener aborts the process when accept() fails with EMFILE, so the server holds
at most a cap of connections below its open-files limit and parks the socket file while it
holds that many (edge/ipc/connections.py). Connections already open keep being served.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from edge.ipc.client import EdgeClient
from edge.ipc.connections import connection_cap
from edge.ipc.server import IpcServer
from edge.serving.core import ServingCore
from support.ipc_fakes import FakeEngine, FakeTokenizer
from support.runtime_proc import start_runtime

# A child that opens N plain connections as fast as it can, reports how many it holds, and
# holds them until its stdin closes. Two of them hold more than one process's 20,000 limit.
FLOOD = r"""
import json, socket, sys, time
path, n = sys.argv[1], int(sys.argv[2])
held, refused = [], 0
for _ in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setblocking(False)
    give_up = time.monotonic() + 2.0
    while True:
        try:
            s.connect(path)
            held.append(s)
            break
        except BlockingIOError:  # the listen backlog is full: try again, as an attacker would
            if time.monotonic() > give_up:
                s.close(); refused += 1; break
            time.sleep(0.0005)
        except OSError:  # no socket file (parked), refused
            s.close(); refused += 1; break
print(json.dumps({"held": len(held), "refused": refused}), flush=True)
sys.stdin.read()
"""


def _limits(pid: int) -> tuple[int, int]:
    for line in open(f"/proc/{pid}/limits"):
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open-files line")


def after_stats(rt) -> dict:
    with EdgeClient(rt.address, timeout_s=5) as c:
        return c.stats()


def _flood(path: str, n: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", FLOOD, path, str(n)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def test_20000_connections_opened_and_held_do_not_end_the_runtime(minilm_package, tmp_path):
    rt = start_runtime(tmp_path, "--package", str(minilm_package))
    floods: list[subprocess.Popen] = []
    try:
        rt.wait_ready()
        path = rt.address[len("ipc://"):]
        with EdgeClient(rt.address, timeout_s=10) as before:  # connected before the flood: keeps its service
            before.embed(["connected before the flood"])
            floods = [_flood(path, 10_000), _flood(path, 10_000)]
            counts = [json.loads(f.stdout.readline()) for f in floods]
            assert sum(c["held"] + c["refused"] for c in counts) == 20_000, counts
            assert rt.proc.poll() is None, rt.output()
            cap = connection_cap(_limits(rt.pid)[0])
            assert cap <= sum(c["held"] for c in counts) < _limits(rt.pid)[0], (cap, counts)
            assert before.embed(["served while the flood holds the cap"]).embeddings.shape == (1, 384)
            stats = before.stats()
            for f in floods:
                f.stdin.close()
                f.wait(30)
            t0 = time.monotonic()
            with EdgeClient(rt.address, timeout_s=5) as after:
                assert after.embed(["after the flood"]).embeddings.shape == (1, 384)
            assert time.monotonic() - t0 < 1.0
            final = after_stats(rt)
        assert rt.proc.poll() is None
        assert stats["state"] == "ready" and stats["connections"]["parked"], stats["connections"]
        assert final["connections"]["parks"] >= 1 and not final["connections"]["parked"], final["connections"]
        assert final["connections"]["peak"] <= _limits(rt.pid)[0] - 1000, final["connections"]
    finally:
        for f in floods:
            if f.poll() is None:
                f.kill()
        rt.stop()


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


@pytest.mark.parametrize("soft, cap", [(1024, 512), (4096, 2560), (20_000, 4096), (65_536, 4096)])
def test_the_cap_leaves_room_for_what_libzmq_accepts_before_it_is_seen(soft, cap):
    assert connection_cap(soft) == cap


def test_at_the_cap_the_socket_file_is_parked_and_open_connections_are_still_served(sock_dir):
    server = IpcServer(f"ipc://{sock_dir}/run/edge.sock", ServingCore(FakeEngine(), FakeTokenizer()),
                       max_connections=40)
    server.start()
    path = f"{sock_dir}/run/edge.sock"
    held: list[socket.socket] = []
    try:
        with EdgeClient(server.address, timeout_s=5) as client:
            client.embed(["first"])
            for _ in range(60):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect(path)
                    held.append(s)
                except OSError:
                    s.close()
            deadline = time.monotonic() + 5
            while not server._conns.parked and time.monotonic() < deadline:
                time.sleep(0.01)
            assert server._conns.parked and 40 <= server._conns.count <= 41 + 100  # cap, plus the backlog at most
            assert client.embed(["while parked"]).embeddings.shape[0] == 1
            with pytest.raises(FileNotFoundError):
                socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect(path)
            for s in held:
                s.close()
            held.clear()
            deadline = time.monotonic() + 5
            while server._conns.parked and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not server._conns.parked
        with EdgeClient(server.address, timeout_s=5) as late:
            assert late.embed(["restored"]).embeddings.shape[0] == 1
    finally:
        for s in held:
            s.close()
        server.request_drain()
        server.wait(10)
