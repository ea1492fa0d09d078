"""``edge trace`` against the real runtime: every reply's trace id, results and errors alike, is
found by ``edge trace`` (a subprocess, as a technician runs it) with its texts, code and lineage;
refused requests show their payload; and what was answered just before SIGTERM is there after the
runtime has stopped (the journal drains at shutdown)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge.errors import EdgeError
from edge.ipc import protocol as P
from edge.ipc.client import EdgeClient

from support.runtime_proc import start_runtime

REPO = Path(__file__).resolve().parents[2]


def _trace(trace_id: str, state: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edge.cli", "trace", trace_id, "--json", "--state-dir", str(state),
                           "--journal-dir", str(state / "j")], capture_output=True, text=True, timeout=60)


def _found(trace_id: str, state: Path, deadline_s: float = 0.0) -> dict:
    """The entry ``edge trace --json`` prints, waiting up to ``deadline_s`` for the writer's flush."""
    end = time.monotonic() + deadline_s
    while True:
        r = _trace(trace_id, state)
        if r.returncode == 0 or time.monotonic() >= end:
            break
        time.sleep(0.2)
    assert r.returncode == 0, f"edge trace {trace_id}: exit {r.returncode}: {r.stderr}"
    return json.loads(r.stdout)


def _git_head() -> str | None:
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        return None
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          timeout=30).stdout.strip() or None


def _refused(client: EdgeClient, frames: list) -> tuple[str, int]:
    client.send_frames(frames)
    reply = client.recv()
    assert reply.is_error, reply.body
    return reply.body["trace_id"], reply.body["code"]


def test_every_reply_is_traced_while_serving_and_after_sigterm(minilm_package, tmp_path):
    state = tmp_path / "state"
    rt = start_runtime(tmp_path, "--package", str(minilm_package), "--engine", "onnxruntime", "--state-dir", str(state),
                       "--journal-dir", str(state / "j"), "--keep-rejected", "3")
    try:
        rt.wait_ready()
        client = EdgeClient(rt.address, timeout_s=60)
        try:
            one = client.embed(["The journal names this request."], request_id="one")
            batch = client.embed(["a batch of three", "texts of different length " * 20, "x"])
            with pytest.raises(EdgeError) as empty:
                client.embed(["   "])
            refused = {
                "oversize": _refused(client, P.encode_request("infer", {"texts": ["y" * 40_000]})),
                "malformed": _refused(client, [P.encode_obj({"v": 1, "type": "infer"}), b"\xc1\xc1 not msgpack"]),
                "unknown": _refused(client, P.encode_request("reticulate", {})),
            }
            stats = client.stats()
        finally:
            client.close()
        assert stats["journal"]["enabled"] and stats["journal"]["dir"] == str(state / "j")
        commit = _git_head()
        e = _found(one.meta["trace_id"], state, deadline_s=10.0)  # the writer flushes every second
        assert e["code"] == 0 and e["texts"] == 1 and e["request_id"] == "one"
        assert e["token_counts"] == one.meta["token_counts"] and e["buckets"] == one.meta["buckets"]
        assert e["lineage"]["model_sha256"] == one.meta["model_sha256"] == stats["lineage"]["model_sha256"]
        assert e["lineage"]["package_sha256"] == one.meta["package_sha256"]
        if commit:
            assert e["lineage"]["edge_commit"] == one.meta["edge_commit"] == commit
        assert all(e["timings_ms"][k] >= 0 for k in ("load", "transfer", "forward", "post", "total"))
        assert e["timings_ms"]["forward"] == pytest.approx(one.meta["compute_ms"], abs=0.01)
        e = _found(batch.meta["trace_id"], state, deadline_s=5.0)
        assert e["texts"] == 3 and e["token_counts"] == batch.meta["token_counts"] and e["batches"]
        e = _found(empty.value.trace_id, state, deadline_s=5.0)
        assert e["code"] == 1005 and e["name"] == "EMPTY_TEXT"
        assert e["rejected_sample"] is None  # the oldest of four refusals: --keep-rejected 3 deleted it
        for name, (trace_id, code) in refused.items():
            e = _found(trace_id, state, deadline_s=5.0)
            assert e["code"] == code and e["type"] == "invalid", name
            assert e["lineage"]["model_sha256"] == one.meta["model_sha256"]
            sample = e["rejected_sample"]
            assert sample is not None and sample["code"] == code, name  # 3 kept: the newest three refusals
        assert _found(refused["oversize"][0], state)["rejected_sample"]["truncated"] is True
        assert bytes.fromhex(_found(refused["malformed"][0], state)["rejected_sample"]["frames"][1]["hex"]) \
            == b"\xc1\xc1 not msgpack"
        assert _found(stats["trace_id"], state)["type"] == "stats"
        # Answered right before SIGTERM: written by the drain, not by a flush.
        client = EdgeClient(rt.address, timeout_s=60)
        try:
            last = [client.embed([f"just before shutdown {i}"]).meta["trace_id"] for i in range(5)]
        finally:
            client.close()
        assert rt.stop() == 0, rt.output()
    finally:
        rt.stop()
    for trace_id in last:
        assert _found(trace_id, state)["code"] == 0
    log = [json.loads(line) for line in rt.output(None).splitlines() if line.startswith("{")]
    assert not [x for x in log if x["event"].startswith("journal.")], "the journal logged a problem"
    on_disk = sum(p.stat().st_size for p in (state / "j").glob("journal-*.jsonl"))
    assert 0 < on_disk <= stats["journal"]["max_bytes"]
