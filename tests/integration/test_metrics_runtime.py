"""The runtime's Prometheus metrics, as users run it (`python -m edge.boot` on the real package):
after a known workload the exposed counts equal what was sent, in the textfile and over HTTP;
promtool accepts both; the textfile is never seen partial; the flags refuse what they must."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from edge.errors import EdgeError, ErrorCode
from edge.ipc.client import EdgeClient
from support.prometheus import promtool_check, samples, scrape_until, total, value
from support.runtime_proc import start_runtime

# Known texts, sent one request at a time: each request's texts of one bucket run as one batch.
REQUESTS = [
    ["hello world"],
    ["the quick brown fox", "jumps over the lazy dog"],
    ["a", "b c", "d e f"],
    ["edge runs on a Jetson"] * 4,
    ["one more request, a little longer than the others but still short"],
]
TOO_LONG = " ".join(["word"] * 2000)  # over the model's maximum: TOO_MANY_TOKENS with truncate=false


def _started_log(rt) -> dict:
    for line in rt.output(None).splitlines():
        if '"metrics.started"' in line:
            return json.loads(line)
    return {}


@pytest.fixture(scope="module")
def metrics_runtime(minilm_package, tmp_path_factory):
    work = tmp_path_factory.mktemp("metrics")
    textdir = work / "textfile"
    textdir.mkdir()
    rt = start_runtime(work, "--package", str(minilm_package), "--engine", "onnxruntime", "--metrics-textfile",
                       str(textdir), "--metrics-interval", "0.05", "--metrics-listen", "127.0.0.1:0")
    try:
        rt.wait_ready()
        deadline = time.monotonic() + 30
        while not _started_log(rt):
            assert time.monotonic() < deadline and rt.proc.poll() is None, rt.output()
            time.sleep(0.05)
        yield rt, textdir / "edge.prom", _started_log(rt)["listen"]
    finally:
        rt.stop()


def test_counts_equal_the_workload_in_the_textfile_and_over_http(metrics_runtime, minilm_package):
    rt, textfile, url = metrics_runtime
    partial, reads, stop = [], [0], threading.Event()

    def read_textfile() -> None:  # all along the workload, at the writer's pace
        while not stop.is_set():
            data = textfile.read_bytes()
            reads[0] += 1
            try:
                found = samples(data)
                assert data.endswith(b"\n") and ("edge_uptime_seconds", ()) in found
                assert any(k[0] == "edge_build_info" for k in found)
            except Exception as exc:  # noqa: BLE001 - recorded, asserted below
                partial.append(f"{type(exc).__name__}: {exc}"[:200])

    reader = threading.Thread(target=read_textfile)
    reader.start()
    token_counts, buckets = [], []
    try:
        with EdgeClient(rt.address, timeout_s=30) as c:
            for texts in REQUESTS:
                meta = c.embed(texts).meta
                token_counts.append(meta["token_counts"])
                buckets.append(meta["buckets"])
            with pytest.raises(EdgeError) as ei:
                c.embed([""])  # refused while parsing: an invalid message
            assert ei.value.code == ErrorCode.EMPTY_TEXT
            with pytest.raises(EdgeError) as ei:
                c.embed([TOO_LONG], truncate=False)  # an infer request, refused after tokenizing
            assert ei.value.code == ErrorCode.TOO_MANY_TOKENS
            with pytest.raises(EdgeError) as ei:
                c.request("bogus", {})
            assert ei.value.code == ErrorCode.UNKNOWN_TYPE
            assert c.health()["ready"] is True
            stats = c.stats()
        found = scrape_until(textfile.read_bytes, lambda f: value(f, "edge_replies_ok_total", type="stats") == 1)
        time.sleep(0.2)  # a few more writes for the reader
    finally:
        stop.set()
        reader.join()
    assert not partial and reads[0] > 10, (partial[:5], reads[0])

    # the tokenizer of the package agrees with the counts the replies carried
    from edge.preload.manifest import open_package
    from edge.preload.tokenizer import load_tokenizer

    pkg = open_package(minilm_package, verify="size")
    tok = load_tokenizer(pkg.path(pkg.manifest.tokenizer))
    assert token_counts == [[len(tok.encode(t).ids) for t in texts] for texts in REQUESTS]

    n_texts = sum(len(t) for t in REQUESTS)
    n_tokens = sum(sum(c) for c in token_counts)
    n_batches = sum(len(set(b)) for b in buckets)  # one batch per bucket of each request
    http = urllib.request.urlopen(url, timeout=10).read()
    for where, data in (("textfile", textfile.read_bytes()), ("http", http)):
        found = samples(data)
        assert value(found, "edge_requests_total", type="infer") == len(REQUESTS) + 1, where
        assert value(found, "edge_requests_total", type="invalid") == 2, where
        assert value(found, "edge_requests_total", type="health") == 1, where
        assert value(found, "edge_requests_total", type="stats") == 1, where
        assert value(found, "edge_requests_total", type="cancel") == 0, where
        assert value(found, "edge_replies_ok_total", type="infer") == len(REQUESTS), where
        assert value(found, "edge_replies_ok_total", type="health") == 1, where
        assert value(found, "edge_replies_error_total", code=1005, name="EMPTY_TEXT") == 1, where
        assert value(found, "edge_replies_error_total", code=1009, name="TOO_MANY_TOKENS") == 1, where
        assert value(found, "edge_replies_error_total", code=1003, name="UNKNOWN_TYPE") == 1, where
        assert total(found, "edge_replies_error_total") == 3, where
        assert total(found, "edge_replies_dropped_total") == 0, where
        assert value(found, "edge_texts_accepted_total") == n_texts, where
        assert total(found, "edge_batch_texts_total") == n_texts, where
        assert total(found, "edge_batch_tokens_total") == n_tokens, where
        assert total(found, "edge_batches_total") == n_batches, where
        for b in {b for bs in buckets for b in bs}:
            in_b = [(c, bb) for cs, bs in zip(token_counts, buckets) for c, bb in zip(cs, bs) if bb == b]
            assert value(found, "edge_batch_tokens_total", bucket=b) == sum(c for c, _ in in_b), where
            assert value(found, "edge_batch_texts_total", bucket=b) == len(in_b), where
            if stats["lineage"]["device"] == "cpu":  # no padding rows on a CPU, and a batch as long as its longest text
                batches = [[c for c, bb in zip(cs, bs) if bb == b] for cs, bs in zip(token_counts, buckets)]
                padded = sum(len(x) * max(x) for x in batches if x)  # one batch per bucket of each request
                assert value(found, "edge_batch_padded_tokens_total", bucket=b) == padded, where
        assert value(found, "edge_batch_size_count") == n_batches, where
        assert value(found, "edge_batch_size_sum") == n_texts, where
        assert value(found, "edge_batch_compute_seconds_count") == n_batches, where
        assert value(found, "edge_request_queue_seconds_count") == len(REQUESTS), where
        assert value(found, "edge_request_duration_seconds_count") == len(REQUESTS), where
        assert value(found, "edge_request_duration_seconds_bucket", le="+Inf") == len(REQUESTS), where
        assert 0 < value(found, "edge_padding_efficiency_ratio") <= 1, where
        assert value(found, "edge_state", state="ready") == 1, where
        assert total(found, "edge_queue_texts") == 0 and value(found, "edge_admitted_texts") == 0, where
        # the boot timeline and the lineage the stats reply gives
        ready_s = stats["timeline"]["exec_to_ready_ms"] / 1000.0
        assert value(found, "edge_boot_exec_to_ready_seconds") == pytest.approx(ready_s), where
        for stage in ("check_metrics_export", "import_manifest", "load_engine", "warm_buckets", "bind", "start"):
            assert value(found, "edge_boot_stage_seconds", stage=stage) >= 0, where
        info = [dict(k[1]) for k in found if k[0] == "edge_build_info"]
        lineage = stats["lineage"]
        assert len(info) == 1 and info[0] == {k: lineage.get(k) or "" for k in info[0]}, where
        assert info[0]["package_sha256"] == pkg.manifest.package_sha256 and info[0]["engine"] == "onnxruntime"
        promtool_check(data)


def test_stop_writes_the_file_a_last_time(metrics_runtime):
    rt, textfile, _ = metrics_runtime
    assert rt.stop() == 0
    found = samples(textfile.read_bytes())
    assert value(found, "edge_state", state="stopped") == 1
    assert sorted(p.name for p in textfile.parent.iterdir()) == ["edge.prom"]  # no temporary file left


@pytest.mark.parametrize("args, env, message", [
    (["--metrics-listen", "0.0.0.0:9464"], {}, "0.0.0.0 accepts connections from other machines"),
    ([], {"EDGE_METRICS_LISTEN": "10.0.0.1:9464"}, "EDGE_METRICS_LISTEN: 10.0.0.1 accepts connections"),
])
def test_a_listener_other_machines_reach_is_refused_without_the_flag(args, env, message, tmp_path):
    r = subprocess.run([sys.executable, "-m", "edge.boot", "--bind", f"ipc://{tmp_path}/edge.sock", *args],
                       capture_output=True, text=True, timeout=60, env={**_env(), **env})
    assert r.returncode == 2 and message in r.stderr and "--metrics-listen-any" in r.stderr, r.stderr
    assert not (tmp_path / "edge.sock").exists()


def test_without_prometheus_client_a_metrics_flag_fails_the_boot_clearly(tmp_path):
    hide = ("import importlib.util, sys; real = importlib.util.find_spec; "
            "importlib.util.find_spec = lambda n, *a: None if n == 'prometheus_client' else real(n, *a); "
            "from edge.boot import main; sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", hide, "--bind", f"ipc://{tmp_path}/edge.sock", "--metrics-textfile",
                        str(tmp_path)], capture_output=True, text=True, timeout=60, env=_env())
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert "[4032 METRICS_UNAVAILABLE]" in r.stderr and "pip install 'edge[metrics]'" in r.stderr, r.stderr
    assert "check_metrics_export" in r.stderr and "Traceback" not in r.stderr


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("EDGE_")}
