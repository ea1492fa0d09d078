"""The serve benchmark: its text mix, its glue baseline server, and a --quick smoke run.

No figure is asserted (the machine is shared and noisy); only that every figure is there,
finite, and of the right sign.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zmq

from bench.serve_server import Server
from bench.textmix import KINDS, describe, text_mix
from edge.ipc import protocol as P

REPO = Path(__file__).resolve().parents[2]


def test_text_mix_is_seeded_and_valid():
    a, b = text_mix(200, seed=3), text_mix(200, seed=3)
    assert a == b
    assert text_mix(200, seed=4) != a
    assert {k for k, _ in a} <= {k[0] for k in KINDS}
    for _, t in a:
        assert t.strip() and len(t.encode()) <= P.Limits().max_text_bytes


def test_describe_counts_buckets_and_truncation(minilm_package):
    from edge.preload.manifest import open_package
    from edge.preload.tokenizer import Tokenizer
    from edge.serving.shapes import BatchShapes
    from edge.preload.serving_settings import ServingSettings

    pkg = open_package(minilm_package, verify="size")
    tok = Tokenizer.open(pkg.path(pkg.manifest.tokenizer))
    shapes = BatchShapes(ServingSettings(buckets=[16, 32, 64, 128, 256]), max_seq_length=256)
    d = describe(["hi", "word " * 400], tok, shapes)
    assert d["tokens"]["min"] == 3 and d["tokens"]["max"] == 256
    assert d["truncated_share"] == 0.5
    assert d["bucket_share"] == {"16": 0.5, "32": 0.0, "64": 0.0, "128": 0.0, "256": 0.5}
    assert d["column_efficiency"] == round((3 + 256) / (16 + 256), 4)


def test_glue_server_speaks_protocol_v1(minilm_package, tmp_path):
    glue = Server("glue", [sys.executable, "-m", "bench.glue_server", "--package", str(minilm_package), "--device", "cpu"], tmp_path)
    try:
        glue.wait_ready()
        s = zmq.Context.instance().socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(glue.address)
        s.send_multipart(P.encode_request("infer", {"texts": ["a short text", "another one"], "request_id": 5}))
        assert s.poll(30_000)
        r = P.decode_reply(s.recv_multipart())
        assert r.type == "infer" and r.body["request_id"] == 5 and r.body["buckets"] == [256, 256]
        emb = P.embeddings_from_frame(r.extra[0], r.body["count"], r.body["dim"])
        assert emb.shape == (2, 384) and np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-4)
        s.send_multipart([b"\x82", b"\x80"])  # truncated msgpack header
        assert s.poll(30_000)
        err = P.decode_reply(s.recv_multipart())
        assert err.type == "error" and err.body["name"] == "MALFORMED_FRAME"
        s.close(0)
        pad = glue.stats()["batches"]
        assert pad["by_bucket"]["256"]["padded_tokens"] == 512
        assert pad["padding_efficiency"] == round(sum(r.body["token_counts"]) / 512, 4)
    finally:
        glue.stop()
    assert glue.proc.returncode == 0


def _finite_positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.mark.slow
def test_quick_run_writes_a_complete_record(minilm_package, tmp_path):
    out = tmp_path / "serve.json"
    cmd = [sys.executable, "-m", "bench.serve", "--quick", "--package", str(minilm_package), "--device", "cpu", "--json", str(out)]
    proc = subprocess.run(cmd, check=False, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = [line for line in proc.stdout.splitlines() if line.startswith("serve ")]
    assert len(summary) == 1, proc.stdout

    rec = json.loads(out.read_text())
    assert rec["command"].startswith("python -m bench.serve") and rec["settings"]["quick"] is True
    assert rec["summary"] == summary[0]
    for key in ("vs_ceiling", "vs_ceiling_mix", "vs_glue", "padding_efficiency"):
        assert _finite_positive(rec["ratios"][key]), (key, rec["ratios"])
    assert rec["ratios"]["padding_efficiency"] <= 1.0
    assert math.isfinite(rec["ratios"]["lone_overhead_ms"])  # a difference: may be negative
    assert set(rec["passed"]) == set(rec["goals"]) == {"vs_ceiling", "vs_glue", "lone_overhead_ms", "padding_efficiency",
                                                            "scaling"}

    assert _finite_positive(rec["ceiling"]["texts_per_s"])
    assert set(rec["ceiling"]["by_bucket"]) <= {"16", "32", "64", "128", "256"}
    assert sum(rec["mix"]["bucket_share"].values()) == pytest.approx(1.0, abs=1e-3)

    modes = [r["mode"] for r in rec["edge"]["runs"]]
    assert modes == ["edge closed c=1", "edge closed c=8", "edge closed c=32", "edge open 50%", "edge open 80%", "edge open 100%"]
    assert [r["mode"] for r in rec["glue"]["runs"]] == ["glue closed c=1", "glue closed c=8", "glue closed c=32"]
    for r in rec["edge"]["runs"] + rec["glue"]["runs"]:
        assert _finite_positive(r["texts_per_s"]), r
        assert r["errors"] == {}, r
        lat = r["latency_ms"]
        assert 0 < lat["min"] <= lat["p50"] <= lat["p95"] <= lat["p99"], r
        assert 0 < r["padding_efficiency"] <= 1.0 and 0 < r["reply_padding_efficiency"] <= 1.0
    for r in rec["edge"]["runs"]:
        assert _finite_positive(r["vs_ceiling"]) and _finite_positive(r["ceiling_texts_per_s"])
    assert rec["lone"]["pairs"] >= 5 and rec["lone"]["by_bucket"]
