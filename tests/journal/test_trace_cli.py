"""``edge trace``: found (exit 0, a block or JSON), not found (exit 1, how far back the journal
reaches), usage and no journal (exit 2); a rejected sample shown; no zmq, numpy or engine imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from journal_support import LINEAGE, finished_request, peer

from edge.observability.journal.rejected import capture
from edge.observability.journal.writer import Journal


def _trace(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edge.cli", "trace", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    """A state directory: a journal of 200 entries (a result, a refused request with its sample, ...)."""
    root = tmp_path_factory.mktemp("state")
    j = Journal(str(root / "journal"), 1 << 20, LINEAGE, rejected_dir=str(root / "rejected"), keep_rejected=2,
                segment_bytes=8 << 10)
    ids = {}
    for i in range(200):
        p = peer()
        j.note("infer", p, 0, None, i, finished_request(p))
        ids.setdefault("first", p.trace_id)
        if i == 100:
            bad = peer()
            bad.sample = capture([b'{"v":1,"type":"nope"}', b"{}"])
            j.note("invalid", bad, 1003, "unknown message type 'nope'", None)
            ids["rejected"] = bad.trace_id
    ids["last"] = p.trace_id
    j.stop()
    return root, ids


def test_found_as_a_block_and_as_json(state):
    root, ids = state
    r = _trace(ids["first"], "--state-dir", str(root))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith(f"trace {ids['first']}  infer  ok") and "tokens 12, 30; buckets 16, 32" in out
    assert "#7 (4 texts), #8 (1 texts)" in out and "forward 5.000" in out and "c" * 40 in out
    r = _trace(ids["last"].upper(), "--journal-dir", str(root / "journal"), "--json")
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["trace_id"] == ids["last"] and rec["request_id"] == 199 and rec["lineage"] == LINEAGE
    assert rec["token_counts"] == [12, 30] and rec["timings_ms"]["forward"] == 5.0 and rec["rejected_sample"] is None


def test_a_rejected_request_shows_its_payload(state):
    root, ids = state
    r = _trace(ids["rejected"], "--state-dir", str(root))
    assert r.returncode == 0, r.stderr
    assert "UNKNOWN_TYPE (1003)" in r.stdout and "frame 0: 21 bytes, 21 kept" in r.stdout
    assert 'text "{\\"v\\":1,\\"type\\":\\"nope\\"}"' in r.stdout
    rec = json.loads(_trace(ids["rejected"], "--state-dir", str(root), "--json").stdout)
    frames = rec["rejected_sample"]["frames"]
    assert bytes.fromhex(frames[0]["hex"]) == b'{"v":1,"type":"nope"}' and frames[1]["text"] == "{}"


def test_not_found_says_how_far_back_the_journal_reaches(state):
    root, _ = state
    r = _trace("0123456789abcdef", "--state-dir", str(root))
    assert r.returncode == 1 and r.stdout == ""
    assert "is not in the journal" in r.stderr and "holds 201 entries in" in r.stderr and " to 20" in r.stderr


@pytest.mark.parametrize("args, message", [
    (["xyz"], "is not a trace id"),
    ([], "give a TRACE_ID"),
    (["--last", "0"], "--last takes"),
])
def test_usage_errors_exit_2(state, args, message):
    root, _ = state
    r = _trace(*args, "--state-dir", str(root))
    assert r.returncode == 2 and message in r.stderr


def test_no_journal_exits_2_naming_the_flags(tmp_path):
    r = _trace("0123456789abcdef", "--state-dir", str(tmp_path))
    assert r.returncode == 2 and "no journal at" in r.stderr and "--journal-dir" in r.stderr
    r = _trace("0123456789abcdef", env={"EDGE_STATE_DIR": str(tmp_path / "nothing")})
    assert r.returncode == 2 and str(tmp_path / "nothing" / "journal") in r.stderr


def test_last_prints_the_newest_entries(state):
    root, ids = state
    recs = json.loads(_trace("--last", "3", "--state-dir", str(root), "--json").stdout)
    assert [r["request_id"] for r in recs] == [197, 198, 199] and recs[-1]["trace_id"] == ids["last"]
    r = _trace("--last", "2", "--state-dir", str(root))
    assert r.returncode == 0 and r.stdout.count("\ntrace ") == 1 and r.stdout.startswith("trace ")


def test_edge_trace_imports_no_zmq_numpy_or_engine(state):
    root, ids = state
    code = ("import sys; from edge.cli import main; rc = main(['trace', %r, '--state-dir', %r]); "
            "print([m for m in ('zmq', 'numpy', 'onnxruntime', 'torch', 'msgpack') if m in sys.modules], rc)"
            % (ids["first"], str(root)))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == "[] 0", (r.stdout, r.stderr)
