"""Fixtures of the serving tests: an in-process IpcServer on a real ipc:// socket in a temp dir."""

from __future__ import annotations

import shutil
import tempfile

import pytest

from edge.ipc.client import EdgeClient
from edge.ipc.protocol import Lineage
from edge.ipc.server import IpcServer
from edge.serving.core import ServingCore
from support.ipc_fakes import MAX_SEQ, SERVING, FakeEngine, FakeTokenizer

LINEAGE = {"model_sha256": "m" * 64, "tokenizer_sha256": "t" * 64, "package_sha256": "p" * 64}


@pytest.fixture
def sock_dir():
    # Short path: an AF_UNIX address holds at most 107 bytes.
    d = tempfile.mkdtemp(prefix="edge-ipc-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def make_server(sock_dir):
    servers: list[IpcServer] = []

    def make(engine=None, serving=None, name="edge.sock", start=True, max_seq_length=MAX_SEQ, lineage=LINEAGE,
             core_kw: dict | None = None, **kw) -> IpcServer:
        engine = engine or FakeEngine()
        core = ServingCore(engine, FakeTokenizer(), {**SERVING, **(serving or {})}, max_seq_length=max_seq_length,
                           **(core_kw or {}))
        lineage = Lineage(**lineage, engine=engine.name, device=engine.device)  # as boot builds it
        server = IpcServer(f"ipc://{sock_dir}/run/{name}", core, lineage, **kw)
        servers.append(server)
        if start:
            server.bind()
            server.start()
        return server

    yield make
    for s in servers:
        s.request_drain()
        assert s.wait(20.0), "server did not stop within 20 s"


@pytest.fixture
def make_client():
    clients: list[EdgeClient] = []

    def make(server_or_addr, **kw) -> EdgeClient:
        addr = getattr(server_or_addr, "address", server_or_addr)
        kw.setdefault("timeout_s", 10.0)
        c = EdgeClient(addr, **kw)
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.close()
