"""The runtime as a real process: READY over sd_notify, embeddings over a real ipc socket."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq

from edge.errors import ErrorCode
from edge.ipc import protocol as P
from edge.ipc.client import EdgeClient

from support.runtime_proc import start_runtime

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Jetson appliances boot in under two seconds.",
    "Ein kurzer deutscher Satz über Maschinen.",
    "日本語の文も埋め込みます。",
    "word " * 300,  # past 256 tokens: truncated like sentence-transformers
]


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edge.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_ready_arrives_on_the_notify_socket_with_a_status(ort_runtime):
    fields = [f for n in ort_runtime.notices for f in n.split(b"\n")]
    assert b"READY=1" in fields
    assert any(f.startswith(b"STATUS=serving") for f in fields)


def test_socket_file_is_group_accessible_only(ort_runtime):
    mode = stat.S_IMODE(os.stat(ort_runtime.address[len("ipc://"):]).st_mode)
    assert mode == 0o660


def test_embeddings_match_sentence_transformers(ort_runtime, st_model):
    with EdgeClient(ort_runtime.address, timeout_s=30) as client:
        result = client.embed(TEXTS)
    ref = st_model.encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True)
    assert result.embeddings.shape == ref.shape == (len(TEXTS), 384)
    cos = np.sum(result.embeddings * ref, axis=1)
    assert cos.min() >= 0.9999, cos
    assert np.abs(result.embeddings - ref).max() <= 1e-4
    meta = result.meta
    assert meta["truncated"][-1] is True and not any(meta["truncated"][:-1])
    assert meta["token_counts"][-1] == 256
    for key in ("trace_id", "queue_ms", "compute_ms", "model_sha256", "tokenizer_sha256", "package_sha256"):
        assert key in meta, key


def test_cli_embed_health_stats(ort_runtime, st_model):
    out = _cli("embed", "--connect", ort_runtime.address, TEXTS[0], TEXTS[1])
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]  # one JSON line per text
    emb = np.asarray([line["embedding"] for line in lines], dtype=np.float32)
    ref = st_model.encode(TEXTS[:2], normalize_embeddings=True)
    assert emb.shape == (2, 384) and np.abs(emb - ref).max() <= 1e-4

    assert _cli("health", "--connect", ort_runtime.address).returncode == 0
    stats = json.loads(_cli("stats", "--connect", ort_runtime.address).stdout)
    stages = [s["stage"] for s in stats["timeline"]["stages"]]
    for stage in ("open_package", "import_engine", "load_engine", "load_tokenizer", "verify_package",
                  "prewarm_device", "preallocate", "warm_buckets", "bind"):
        assert stage in stages, stages
    assert stats["timeline"]["exec_to_ready_ms"] > 0


def test_health_of_absent_server_fails(tmp_path):
    out = _cli("health", "--connect", f"ipc://{tmp_path}/nobody.sock", "--timeout", "0.5")
    assert out.returncode != 0


def test_timeline_is_logged_and_written(ort_runtime):
    record = json.loads((ort_runtime.workdir / "timeline.json").read_text())
    assert record["exec_to_ready_ms"] > 0
    last_end = max(s["end_ms"] for s in record["stages"])
    assert last_end <= record["exec_to_ready_ms"]
    lines = [json.loads(line) for line in ort_runtime.output().splitlines() if line.startswith("{")]
    ready = [e for e in lines if e["event"] == "boot.ready"]
    assert len(ready) == 1 and ready[0]["stages"] == record["stages"]


def test_timeline_says_how_each_file_was_checked(ort_runtime, minilm_package):
    """fs-verity's measured digest where this machine has it on the package's files, else sha256
    (here: no CONFIG_FS_VERITY), named per file in the verify stages."""
    from edge.preload.verity import measure

    record = json.loads((ort_runtime.workdir / "timeline.json").read_text())
    stages = {s["stage"]: s for s in record["stages"]}
    expect = lambda name: "fsverity" if measure(minilm_package / name) else "sha256"  # noqa: E731
    assert stages["verify_package"]["verified_by"] == {"model.ort": expect("model.ort")}, stages["verify_package"]
    assert stages["verify_tokenizer"]["verified_by"] == {"tokenizer.fb": expect("tokenizer.fb")}


def test_a_fresh_cpu_boot_warms_one_shape_before_ready_and_the_rest_once_idle(ort_runtime):
    """``--warm-up auto`` on a fresh CPU boot: the smallest bucket before READY, the others on the idle
    engine after it; each then has its own yardstick, and the replies are the same as ever."""
    record = json.loads((ort_runtime.workdir / "timeline.json").read_text())
    warm = next(s for s in record["stages"] if s["stage"] == "warm_buckets")
    with EdgeClient(ort_runtime.address, timeout_s=60) as client:
        buckets = client.stats()["settings"]["buckets"]
        assert warm["shapes"] == 1 and warm["deferred"] == [f"1x{b}" for b in buckets[1:]], warm
        deadline = time.monotonic() + 60.0
        while (w := client.stats()["warm_up"])["deferred_left"]:
            assert time.monotonic() < deadline, w
            time.sleep(0.05)  # poll interval
    assert set(w["after_ready_ms"]) == set(warm["deferred"]), w
    assert set(w["yardstick_ms"]) == {f"1x{b}" for b in buckets} and all(ms > 0 for ms in w["yardstick_ms"].values()), w
    assert '"warmup.deferred_done"' in ort_runtime.output()


def test_drain_on_sigterm_answers_every_request_once(minilm_package, tmp_path):
    rt = start_runtime(tmp_path / "drain", "--package", str(minilm_package), "--drain-timeout", "20")
    try:
        rt.wait_ready()
        ctx = zmq.Context()
        socks = [ctx.socket(zmq.DEALER) for _ in range(4)]
        for s in socks:
            s.setsockopt(zmq.LINGER, 0)
            s.connect(rt.address)
        sent = {i: 0 for i in range(len(socks))}

        def send_some(n):
            for i, s in enumerate(socks):
                for k in range(n):
                    s.send_multipart(P.encode_request("infer", {"texts": [f"request {i}-{k} " * (1 + k % 40)], "request_id": f"{i}-{sent[i]}"}))
                    sent[i] += 1

        send_some(10)
        with EdgeClient(rt.address, timeout_s=30) as probe:  # the signal comes once all 40 have arrived
            received_by = time.monotonic() + 30
            while (received := probe.stats()["requests"].get("infer", 0)) < sum(sent.values()):
                assert time.monotonic() < received_by, f"the runtime received {received} of {sum(sent.values())} requests"
                time.sleep(0.005)  # poll interval
        rt.proc.send_signal(__import__("signal").SIGTERM)
        send_some(5)  # these race the drain: a result or SHUTTING_DOWN, never silence
        replies = {i: [] for i in range(len(socks))}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sum(map(len, replies.values())) < sum(sent.values()):
            for i, s in enumerate(socks):
                while s.poll(10):
                    replies[i].append(P.decode_reply(s.recv_multipart()))
        assert rt.proc.wait(60) == 0
        for i, s in enumerate(socks):
            while s.poll(100):
                replies[i].append(P.decode_reply(s.recv_multipart()))
            ids = [r.body.get("request_id") for r in replies[i]]
            assert sorted(ids) == sorted(f"{i}-{k}" for k in range(sent[i])), ids
            for r in replies[i]:
                assert not r.is_error or r.body["code"] == ErrorCode.SHUTTING_DOWN, r.body
            s.close()
        ctx.term()
        assert "shutdown.done" in rt.output()
    finally:
        rt.stop()


def _copy_package(src, dst):
    shutil.copytree(src, dst)
    for p in dst.iterdir():
        p.chmod(0o644)
    return dst


def _boot_with_a_flipped_byte(minilm_package, tmp_path, name: str, offset: int):
    """Boot a copy of the package with one byte of ``name`` flipped; the runtime once it exited."""
    pkg = _copy_package(minilm_package, tmp_path / "pkg")
    with open(pkg / name, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    rt = start_runtime(tmp_path / "bad", "--package", str(pkg))
    code = rt.proc.wait(120)
    rt.stop()
    assert code != 0
    assert "READY=1" not in b"\n".join(rt.notices).decode()
    return rt


def test_tampered_package_fails_boot_naming_stage_and_file(minilm_package, tmp_path):
    out = _boot_with_a_flipped_byte(minilm_package, tmp_path, "model.ort", 4096).output()
    assert "verify_package" in out and "model.ort" in out, out


def test_package_tampered_after_the_engine_loaded_is_refused_ready_and_never_answers(minilm_package, tmp_path):
    """The engine loads and warms beside the hash of its files: a file changed once the engine has
    loaded it (and before its hash ended) fails the boot in verify_package, with no READY and no
    reply from the engine that was loaded, even to a request sent before the boot ended."""
    from support.pythonpath import child_env

    pkg = _copy_package(minilm_package, tmp_path / "pkg")
    wrap = [sys.executable, "-m", "support.tamper_after_load", "model.ort", "--"]
    rt = start_runtime(tmp_path / "late", "--package", str(pkg), wrap=wrap, env=child_env())
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(rt.address)  # queued by ZeroMQ until a bind, which must never come
        sock.send_multipart(P.encode_request("infer", {"texts": ["sent while the engine warmed up"]}))
        code = rt.proc.wait(120)
        assert not sock.poll(500), "a reply came from a package that failed its hash"
    finally:
        sock.close()
        ctx.term()
        rt.stop()
    out = rt.output(tail=None)
    assert code == 3, out
    assert "READY=1" not in b"\n".join(rt.notices).decode()
    failed = [json.loads(line) for line in out.splitlines() if '"boot.failed"' in line]
    assert failed and failed[0]["stage"] == "verify_package", out
    assert "model.ort" in failed[0]["error"] and failed[0]["code"] == ErrorCode.PACKAGE_HASH_MISMATCH, failed[0]
    stages = {s["stage"]: s for s in failed[0]["timeline"]["stages"]}
    # the engine had loaded from the file before its hash ended: the case this test is about
    assert stages["load_engine"]["end_ms"] <= stages["verify_package"]["end_ms"], stages
    assert "bind" not in stages and "start" not in stages, stages
    assert not (tmp_path / "late" / "run" / "edge.sock").exists()


def test_missing_package_fails_in_open_package(tmp_path):
    rt = start_runtime(tmp_path / "none", "--package", str(tmp_path / "does-not-exist"))
    code = rt.proc.wait(60)
    rt.stop()
    assert code != 0
    assert "open_package" in rt.output() and "--package" in rt.output()


@pytest.mark.slow
def test_torchscript_engine_serves_the_same_embeddings(minilm_package, tmp_path, st_model):
    rt = start_runtime(tmp_path / "ts", "--package", str(minilm_package), "--engine", "torchscript")
    try:
        rt.wait_ready()
        with EdgeClient(rt.address, timeout_s=60) as client:
            result = client.embed(TEXTS)
            stats = client.stats()
        ref = st_model.encode(TEXTS, normalize_embeddings=True)
        assert np.abs(result.embeddings - ref).max() <= 1e-4
        # the engine that served, as the reply and the runtime's lineage name it: never a default
        assert "engine" in result.meta, f"the reply does not name its engine: {result.meta}"
        assert result.meta["engine"] == "torchscript", result.meta
        assert stats["lineage"]["engine"] == "torchscript", stats["lineage"]
    finally:
        assert rt.stop() == 0


def test_request_sent_before_bind_is_served_not_refused(minilm_package, tmp_path):
    # What a cold-start client does: connect and send at once, before the
    # server has bound. ZeroMQ queues the request; it must get a result.
    rt = start_runtime(tmp_path / "early", "--package", str(minilm_package))
    try:
        with EdgeClient(rt.address, timeout_s=120) as client:
            result = client.embed(["sent before the server was ready"])
        assert result.embeddings.shape == (1, 384)
        rt.wait_ready()
    finally:
        assert rt.stop() == 0


def test_tampered_tokenizer_fails_boot_in_verify_tokenizer(minilm_package, tmp_path):
    """The main thread's own check, while the engine chain runs beside it: its stage is the one reported."""
    out = _boot_with_a_flipped_byte(minilm_package, tmp_path, "tokenizer.fb", 1000).output()
    failed = [json.loads(line) for line in out.splitlines() if '"boot.failed"' in line]
    assert failed and failed[0]["stage"] == "verify_tokenizer" and "tokenizer.fb" in failed[0]["error"], out


def _package_with_edited_manifest(minilm_package, tmp_path, edit):
    """A copy of the package whose manifest ``edit(data)`` changed, re-sealed (package_sha256)."""
    from edge.preload.manifest import manifest_digest

    pkg = _copy_package(minilm_package, tmp_path / "pkg")
    data = json.loads((pkg / "manifest.json").read_text())
    edit(data)
    data["package_sha256"] = manifest_digest(data)
    (pkg / "manifest.json").write_text(json.dumps(data))
    return pkg


def test_package_without_warm_ids_boots_with_the_tokenizer_handed_over(minilm_package, tmp_path):
    """A package built before serving.warm_sample_ids existed: the warm-up waits for the tokenizer instead."""
    pkg = _package_with_edited_manifest(minilm_package, tmp_path, lambda d: d["serving"].pop("warm_sample_ids"))
    rt = start_runtime(tmp_path / "old", "--package", str(pkg))
    try:
        rt.wait_ready()
        with EdgeClient(rt.address, timeout_s=30) as client:
            result = client.embed(TEXTS[:2])
            stats = client.stats()
        assert result.embeddings.shape == (2, 384)
        stages = {s["stage"]: s for s in stats["timeline"]["stages"]}
        # the tokenizer was loaded before the warm-up began: it came from the main thread
        assert stages["warm_buckets"]["start_ms"] >= stages["load_tokenizer"]["end_ms"]
    finally:
        rt.stop()


def test_engine_missing_from_the_package_fails_at_once_in_select_engine(minilm_package, tmp_path):
    def without_torchscript(d):  # as a package built for onnxruntime alone: no engine, no fresh budget of it
        d["engines"].pop("torchscript")
        d["selftest"]["fresh_boot_budget_ms"].pop("torchscript", None)

    pkg = _package_with_edited_manifest(minilm_package, tmp_path, without_torchscript)
    rt = start_runtime(tmp_path / "noeng", "--package", str(pkg), "--engine", "torchscript")
    code = rt.proc.wait(60)
    rt.stop()
    failed = [json.loads(line) for line in rt.output().splitlines() if '"boot.failed"' in line]
    assert code != 0 and failed and failed[0]["stage"] == "select_engine", rt.output()
    assert "torchscript" in failed[0]["error"] and "import_engine" not in {s["stage"] for s in failed[0]["timeline"]["stages"]}
