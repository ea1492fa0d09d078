"""Fixtures of the metrics tests: an in-process server with the fake engine and tokenizer."""

from __future__ import annotations

import shutil
import tempfile

import pytest

from edge.ipc.client import EdgeClient
from edge.ipc.protocol import Lineage
from edge.ipc.server import IpcServer
from edge.serving.core import ServingCore
from edge.runtime.timeline import Timeline
from support.ipc_fakes import FakeEngine, FakeTokenizer

SERVING = {"buckets": [8, 16, 32, 64], "max_batch_size": 8, "max_batch_tokens": 256, "max_delay_ms": 2.0,
           "max_queue_requests": 64, "max_queue_tokens": 4096}  # the 64 bucket holds 4 rows
LINEAGE = {"model": "fake-model", "model_sha256": "m" * 64, "tokenizer_sha256": "t" * 64,
           "package_sha256": "p" * 64, "edge_version": "0.1.0"}


@pytest.fixture
def make_fake_server():
    """``make(**serving)``: a started IpcServer on an ipc socket in a temp dir, with a boot
    timeline of two stages; ``serving`` overrides SERVING."""
    made: list[tuple[IpcServer, str]] = []

    def make(**serving) -> IpcServer:
        d = tempfile.mkdtemp(prefix="edge-metrics-", dir="/tmp")
        engine = FakeEngine()
        core = ServingCore(engine, FakeTokenizer(), {**SERVING, **serving}, max_seq_length=64)
        timeline = Timeline(exec_s=0.0)
        timeline.add("import_manifest", 10.0, 12.5)
        timeline.add("load_engine", 12.5, 40.0)
        timeline.ready_ms = 55.0
        server = IpcServer(f"ipc://{d}/run/edge.sock", core,
                           Lineage(**LINEAGE, engine=engine.name, device=engine.device), timeline=timeline.as_dict)
        made.append((server, d))
        server.bind()
        server.start()
        return server

    yield make
    for server, d in made:
        server.request_drain()
        assert server.wait(20.0), "server did not stop within 20 s"
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def fake_server(make_fake_server):
    return make_fake_server()


@pytest.fixture
def client():
    clients: list[EdgeClient] = []

    def make(server) -> EdgeClient:
        c = EdgeClient(server.address, timeout_s=10.0)
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.close()
