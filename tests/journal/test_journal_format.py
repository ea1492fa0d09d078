"""The journal's bytes: an entry line round-trips, starts with its trace id, and is one ASCII line."""

from __future__ import annotations

import json

import pytest
from journal_support import LINEAGE, finished_request, peer

from edge.observability.journal.format import (
    ENTRY_START,
    entry_line,
    expand,
    header_line,
    is_trace_id,
    lineage_id,
    lineage_line,
    segment_name,
    segment_seq,
)
from edge.observability.journal.writer import Journal
from edge.serving.request import phases_ms


def _item(journal: Journal):
    """The one tuple ``note`` queued (the journal is not started: nothing is written)."""
    (item,) = list(journal._q)
    return item


def test_a_result_entry_round_trips_with_every_field(tmp_path):
    j = Journal(str(tmp_path / "j"), 1 << 20, LINEAGE)
    p = peer("9f1c2ab04d3e5f60")
    request = finished_request(p)
    j.note("infer", p, 0, None, "req-1", request)
    item = _item(j)
    replied = item[3]
    line = entry_line(item, 1_000_000.0, j.lid)
    assert line.startswith(b'{"t":"9f1c2ab04d3e5f60","ts":') and line.endswith(b"\n") and line.count(b"\n") == 1
    assert (b"\n" + line).startswith(ENTRY_START)
    line.decode("ascii")  # ASCII only
    e = expand(json.loads(line))
    assert e["trace_id"] == "9f1c2ab04d3e5f60" and e["type"] == "infer" and e["code"] == 0 and e["name"] == "OK"
    assert e["time_ms"] == int((p.received + 1_000_000.0) * 1000) and e["time"].endswith("Z")
    assert e["client"] == {"identity": "0080000001", "connection": 3, "peer": "host:1000:1000:4242"}
    assert e["request_id"] == "req-1" and e["texts"] == 2
    assert e["token_counts"] == [12, 30] and e["buckets"] == [16, 32] and e["truncated"] == [False, True]
    assert e["batches"] == [{"batch": 7, "texts": 4}, {"batch": 8, "texts": 1}]
    t = e["timings_ms"]
    assert t["load"] == pytest.approx(0.4, abs=1e-3) and t["transfer"] == pytest.approx(1.2, abs=2e-3)
    assert t["forward"] == 5.0 and t["post"] == pytest.approx((replied - request.done) * 1000, abs=1e-3)
    assert t["load"] + t["transfer"] + t["forward"] + t["post"] == pytest.approx(t["total"], abs=5e-3)
    assert e["degraded"] is False and e["dropped"] is None and e["lineage_id"] == lineage_id(LINEAGE)


def test_an_error_entry_keeps_code_name_message_and_odd_request_ids(tmp_path):
    j = Journal(str(tmp_path / "j"), 1 << 20, LINEAGE)
    j.note("invalid", peer("0000000000000001", conn=0, address=None), 1003, "unknown message type 'x'\n" * 20,
           "\ud800 lone surrogate\n", drop="hwm")
    line = entry_line(_item(j), 0.0, j.lid)
    assert line.count(b"\n") == 1
    line.decode("ascii")
    e = expand(json.loads(line))
    assert e["code"] == 1003 and e["name"] == "UNKNOWN_TYPE" and len(e["message"]) == 200
    assert e["request_id"] == "\ud800 lone surrogate\n" and e["dropped"] == "hwm"
    assert e["texts"] is None and e["token_counts"] == [] and e["client"]["connection"] is None
    assert list(e["timings_ms"]) == ["load", "transfer", "forward", "post", "total"]
    assert e["timings_ms"]["load"] is None and e["timings_ms"]["total"] >= 0


def test_phases_add_up_and_missing_stamps_give_none():
    assert phases_ms(10.0, 10.001, 10.011, 8.0, 10.012) == pytest.approx([1.0, 2.0, 8.0, 1.0, 12.0])
    assert phases_ms(10.0, 10.001, None, 0.0, 10.5) == pytest.approx([1.0, None, None, None, 500.0])
    assert phases_ms(10.0, None, None, 0.0, 10.002) == pytest.approx([None, None, None, None, 2.0])


def test_names_headers_and_lineage_records():
    assert segment_name(7) == "journal-0000000007.jsonl" and segment_seq("journal-0000000007.jsonl") == 7
    assert segment_seq("journal-x.jsonl") is None and segment_seq(".lock") is None
    h = json.loads(header_line(7, 42, 1234))
    assert h == {"journal": 1, "segment": 7, "created": 1234, "pid": 42}
    lid = lineage_id(LINEAGE)
    assert len(lid) == 12 and lid == lineage_id(dict(reversed(list(LINEAGE.items()))))  # key order does not matter
    assert lineage_line(lid, LINEAGE).startswith(b'{"L":"' + lid.encode() + b'"')
    assert json.loads(lineage_line(lid, LINEAGE))["lineage"] == LINEAGE
    assert is_trace_id("9f1c2ab04d3e5f60") and not is_trace_id("9F1C2AB04D3E5F60") and not is_trace_id("9f1c")
