"""The journal behind a real ipc:// socket (in-process server, fake engine): every reply is
noted, results carry their phases (also in stats and the metrics), refused requests keep their
payload, and the I/O thread never waits for the disk."""

from __future__ import annotations

import shutil
import tempfile

import pytest
from journal_support import wait_for

from edge.errors import EdgeError
from edge.ipc.client import EdgeClient
from edge.ipc.protocol import Lineage
from edge.ipc.server import IpcServer
from edge.observability.journal import reader
from edge.observability.journal.format import expand
from edge.observability.journal.rejected import read_sample
from edge.observability.journal.writer import Journal
from edge.serving.core import ServingCore
from support.ipc_fakes import FakeEngine, FakeTokenizer

SERVING = {"buckets": [8, 16, 32, 64], "max_batch_size": 8, "max_batch_tokens": 256, "max_delay_ms": 2.0,
           "max_queue_requests": 64, "max_queue_tokens": 4096}


@pytest.fixture
def served():
    d = tempfile.mkdtemp(prefix="edge-journal-", dir="/tmp")
    engine = FakeEngine()
    lineage = Lineage(model="fake", model_sha256="m" * 64, engine=engine.name, device=engine.device,
                      edge_version="0.1.0", edge_commit="c" * 40)
    server = IpcServer(f"ipc://{d}/run/edge.sock", ServingCore(engine, FakeTokenizer(), SERVING, max_seq_length=64),
                       lineage)
    server.journal = Journal(f"{d}/state/journal", 1 << 20, lineage.as_dict(), rejected_dir=f"{d}/state/rejected",
                             keep_rejected=3, flush_s=0.1)
    server.bind()
    server.start()
    server.journal.start()
    client = EdgeClient(server.address, timeout_s=10.0)
    try:
        yield server, client, d
    finally:
        client.close()
        server.request_drain()
        assert server.wait(20.0)
        server.journal.stop(5.0)
        shutil.rmtree(d, ignore_errors=True)


def _entry(d: str, trace_id: str) -> dict:
    found = wait_for(lambda: reader.find(f"{d}/state/journal", trace_id), 5.0)
    assert found, f"{trace_id} not journaled within 5 s"
    return {**expand(found.entry), "lineage": found.lineage}


def test_every_reply_is_journaled_with_its_trace_id(served):
    server, client, d = served
    result = client.embed(["a b c", "w " * 20], request_id="r-1")
    with pytest.raises(EdgeError) as empty:
        client.embed([" "])
    health = client.health()
    client.send("cancel", {"request_id": "nothing"})
    cancel = client.recv()
    client.send_frames([b'{"v":1,"type":"nope"}', b"{}"])
    unknown = client.recv()
    stats = client.stats()
    e = _entry(d, result.meta["trace_id"])
    assert e["type"] == "infer" and e["code"] == 0 and e["request_id"] == "r-1" and e["texts"] == 2
    assert e["token_counts"] == result.meta["token_counts"] and e["buckets"] == result.meta["buckets"]
    assert e["batches"] and all(b["texts"] >= 1 for b in e["batches"])
    t = e["timings_ms"]
    assert all(t[k] is not None and t[k] >= 0 for k in ("load", "transfer", "forward", "post"))
    assert t["load"] + t["transfer"] + t["forward"] + t["post"] == pytest.approx(t["total"], abs=0.01)
    assert e["lineage"]["edge_commit"] == "c" * 40 == result.meta["edge_commit"]
    assert e["client"]["connection"] >= 1 and e["client"]["peer"] and len(e["client"]["identity"]) >= 2
    e = _entry(d, empty.value.trace_id)
    assert e["code"] == 1005 and e["name"] == "EMPTY_TEXT" and e["type"] == "invalid"
    assert _entry(d, health["trace_id"])["type"] == "health"
    assert _entry(d, cancel.body["trace_id"])["code"] == 2005
    e = _entry(d, unknown.body["trace_id"])
    assert e["code"] == 1003 and e["type"] == "invalid"
    sample = read_sample(f"{d}/state/rejected", unknown.body["trace_id"])
    assert sample["frames"][0]["data"] == b'{"v":1,"type":"nope"}' and sample["truncated"] is False
    assert read_sample(f"{d}/state/rejected", result.meta["trace_id"]) is None  # served: no sample
    assert stats["journal"]["enabled"] and stats["journal"]["rejected"]["keep"] == 3
    assert _entry(d, stats["trace_id"])["type"] == "stats"
    lat = stats["latency_ms"]
    assert all(lat[p]["count"] == 1 for p in ("load", "transfer", "forward", "post"))


def test_phase_histograms_and_journal_metrics_are_exported(served):
    pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    from edge.observability.metrics.export import registry_for, render

    server, client, d = served
    client.embed(["x y"])
    wait_for(lambda: server.journal.written >= 1)
    found = {}
    for fam in text_string_to_metric_families(render(registry_for(server)).decode()):
        for s in fam.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert found[("edge_request_phase_seconds_count", (("phase", "forward"),))] == 1
    assert found[("edge_request_phase_seconds_bucket", (("le", "+Inf"), ("phase", "load")))] == 1
    assert found[("edge_journal_enabled", ())] == 1 and found[("edge_journal_entries_written_total", ())] >= 1
    assert found[("edge_journal_bytes", ())] > 0 and found[("edge_journal_max_bytes", ())] == 1 << 20


def test_a_journal_that_cannot_write_costs_no_request(served):
    server, client, d = served
    server.journal._fail("journal", OSError(30, "Read-only file system"))  # as the writer does on EROFS
    for i in range(5):
        assert client.embed([f"still served {i}"]).meta["count"] == 1
    info = client.stats()["journal"]
    assert info["enabled"] is False and info["dropped_by_reason"]["disabled"] >= 5
