"""The exposition: families from the serving metrics, the queue, the boot, the lineage and the
device telemetry, in Prometheus' conventions (base units, _total counters, real histograms)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from edge.errors import EdgeError, ErrorCode
from edge.observability.metrics.export import (
    boot_families, build_info, registry_for, render, snapshot_families, telemetry_families,
)
from edge.serving.metrics import LATENCY_BOUNDS_MS, Metrics
from support.ipc_fakes import text_of_tokens
from support.prometheus import promtool_check, samples, scrape_until, total, value


def _exposition(families) -> dict:
    from prometheus_client import CollectorRegistry, generate_latest

    class One:
        def collect(self):
            return list(families)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(One())
    return samples(generate_latest(registry))


# ------------------------------------------------------------------ Metrics.snapshot()


def test_histograms_are_in_seconds_cumulative_with_sum_and_count():
    m = Metrics([8, 16])
    for ms in (0.05, 0.3, 0.3, 7.0, 20000.0):  # the last one is above every bound
        m.replied("infer", queue_ms=ms, total_ms=ms * 2)
    found = _exposition(snapshot_families(m.snapshot()))
    bounds = [b / 1000 for b in LATENCY_BOUNDS_MS]
    assert value(found, "edge_request_queue_seconds_bucket", le="0.0001") == 1
    assert value(found, "edge_request_queue_seconds_bucket", le="0.0005") == 3
    assert value(found, "edge_request_queue_seconds_bucket", le="0.01") == 4
    assert value(found, "edge_request_queue_seconds_bucket", le="10.0") == 4
    assert value(found, "edge_request_queue_seconds_bucket", le="+Inf") == 5
    assert value(found, "edge_request_queue_seconds_count") == 5
    assert value(found, "edge_request_queue_seconds_sum") == pytest.approx((0.05 + 0.6 + 7 + 20000) / 1000, abs=1e-6)
    les = sorted(float(dict(k[1])["le"]) for k in found if k[0] == "edge_request_queue_seconds_bucket")
    assert les == sorted(bounds + [math.inf])
    per_le = sorted((float(dict(k[1])["le"]), v) for k, v in found.items()
                    if k[0] == "edge_request_duration_seconds_bucket")
    assert [v for _, v in per_le] == sorted(v for _, v in per_le)  # cumulative
    assert value(found, "edge_batch_compute_seconds_count") == 0


def test_counters_by_type_code_bucket_and_reason():
    m = Metrics([8, 16])
    for t in ("infer", "infer", "health", "stats", "bogus"):
        m.received(t)
    m.accepted(3)
    m.replied("infer", 1.0, 2.0)
    m.replied("health")
    m.error(ErrorCode.EMPTY_TEXT)
    m.error(ErrorCode.OVERLOADED)
    m.error(ErrorCode.OVERLOADED)
    m.reply_dropped("hwm")
    m.batch(8, texts=2, rows=2, width=8, tokens=11, compute_ms=1.0)
    m.batch(16, texts=1, rows=4, width=16, tokens=9, compute_ms=1.0)  # padded up to 4 rows and the bucket (CUDA)
    m.engine_failed()
    found = _exposition(snapshot_families(m.snapshot(), caps=[8, 4]))
    assert value(found, "edge_requests_total", type="infer") == 2
    assert value(found, "edge_requests_total", type="invalid") == 1 and value(found, "edge_requests_total",
                                                                                type="cancel") == 0
    assert value(found, "edge_replies_ok_total", type="infer") == 1
    assert value(found, "edge_replies_error_total", code=1005, name="EMPTY_TEXT") == 1
    assert value(found, "edge_replies_error_total", code=2000, name="OVERLOADED") == 2
    assert value(found, "edge_replies_error_total", code=3001, name="ENGINE_FAILED") == 0  # present before the first
    assert not any(dict(k[1]).get("code", "").startswith("4") for k in found)  # boot codes never reach the wire
    assert value(found, "edge_replies_dropped_total", reason="hwm") == 1
    assert value(found, "edge_texts_accepted_total") == 3
    assert value(found, "edge_batches_total", bucket=8) == 1 and value(found, "edge_batches_total", bucket=16) == 1
    assert value(found, "edge_batch_texts_total", bucket=16) == 1
    assert value(found, "edge_batch_rows_total", bucket=16) == 4
    assert value(found, "edge_batch_tokens_total", bucket=8) == 11
    assert value(found, "edge_batch_padded_tokens_total", bucket=16) == 64
    assert value(found, "edge_engine_failures_total") == 1
    assert value(found, "edge_padding_efficiency_ratio") == pytest.approx(20 / 80)
    assert value(found, "edge_batch_size_bucket", le="1.0") == 1
    assert value(found, "edge_batch_size_bucket", le="2.0") == 2
    assert value(found, "edge_batch_size_bucket", le="8.0") == 2
    assert value(found, "edge_batch_size_count") == 2 and value(found, "edge_batch_size_sum") == 3


def test_no_batch_yet_no_padding_ratio():
    found = _exposition(snapshot_families(Metrics([8]).snapshot()))
    assert not [k for k in found if k[0] == "edge_padding_efficiency_ratio"]
    assert value(found, "edge_batch_size_count") == 0


# ------------------------------------------------------------------ boot, lineage


def test_boot_stages_in_seconds_a_repeated_stage_summed_odd_entries_skipped():
    timeline = {"stages": [{"stage": "load_engine", "duration_ms": 1500.0}, {"stage": "bind", "duration_ms": 2.0},
                           {"stage": "bind", "duration_ms": 1.0}, {"stage": "broken"}, "junk"],
                "exec_to_ready_ms": 2500.0, "start": "restored"}
    found = _exposition(boot_families(timeline))
    assert value(found, "edge_boot_stage_seconds", stage="load_engine") == 1.5
    assert value(found, "edge_boot_stage_seconds", stage="bind") == pytest.approx(0.003)
    assert ("edge_boot_stage_seconds", (("stage", "broken"),)) not in found
    assert value(found, "edge_boot_exec_to_ready_seconds") == 2.5 and value(found, "edge_boot_restored") == 1
    assert _exposition(boot_families(None)) == {}
    assert value(_exposition(boot_families({})), "edge_boot_restored") == 0


def test_build_info_names_the_lineage_and_none_as_empty():
    found = _exposition([build_info({"model": "m", "model_sha256": "a" * 64, "bundle_sha256": None, "engine": "ort"})])
    (key, v), = found.items()
    labels = dict(key[1])
    assert key[0] == "edge_build_info" and v == 1
    assert labels["model"] == "m" and labels["model_sha256"] == "a" * 64 and labels["engine"] == "ort"
    assert labels["bundle_sha256"] == "" and labels["device"] == ""
    assert set(labels) == {"edge_version", "edge_commit", "model", "model_sha256", "tokenizer_sha256",
                           "package_sha256", "bundle_sha256", "engine", "device"}


# ------------------------------------------------------------------ telemetry

# A sample as edge/observability/telemetry's sampler publishes it (a Jetson Orin, abridged), with the gaps a
# real device has: a reading that failed (None), a section that is absent.
JETSON = {
    "device": {"jetson": True, "model": "NVIDIA Jetson AGX Orin", "l4t": "36.3.0", "compatible": ["nvidia,tegra234"]},
    "gpu": {"devfreq": "17000000.gpu", "name": "ga10b", "load_pct": 37.5, "cur_freq_hz": 306000000,
            "min_freq_hz": 306000000, "max_freq_hz": 1300500000, "governor": "nvhost_podgov"},
    "thermal_c": {"cpu-thermal": 45.5, "gpu-thermal": 44.0, "tj-thermal": 46.1},
    "power": {"VDD_IN": {"voltage_mv": 5040, "current_ma": 1210, "power_w": 6.098},
              "VDD_CPU_GPU_CV": {"voltage_mv": 5040, "current_ma": None, "power_w": None}},
    "memory": {"total_bytes": 32 << 30, "available_bytes": 28 << 30, "used_bytes": 4 << 30, "swap_total_bytes": 0,
               "swap_free_bytes": 0, "unified": True},
    "nvpmodel": {"id": 0, "name": "MAXN", "default_id": 2},
    "cpu": {"online": [0, 1, 2, 3], "freq_khz": {"0": 729600, "1": 1190400}, "present": 12, "load_pct": 12.5},
    "process": {"rss_bytes": 250 << 20, "rss_peak_bytes": 300 << 20, "threads": 17},
    "jtop": None, "nvml": None,
    "sources": {"sysfs": "ok", "jtop": "not enabled", "nvml": "off on a Jetson"},
    "absent": {"power.VDD_CPU_GPU_CV.current_ma": "/sys/...: Resource temporarily unavailable"},
    "interval_s": 5.0, "samples": 3, "at": 1700000000.0, "read_ms": 1.25, "age_ms": 800.0,
}


def test_telemetry_of_a_jetson_in_base_units():
    found = _exposition(telemetry_families(JETSON))
    assert value(found, "edge_telemetry_gpu_load_ratio", gpu="ga10b") == 0.375
    assert value(found, "edge_telemetry_gpu_frequency_hertz", gpu="ga10b") == 306e6
    assert value(found, "edge_telemetry_temperature_celsius", zone="tj-thermal") == 46.1
    assert value(found, "edge_telemetry_power_watts", rail="VDD_IN") == 6.098
    assert value(found, "edge_telemetry_power_volts", rail="VDD_IN") == 5.04
    assert value(found, "edge_telemetry_power_amperes", rail="VDD_IN") == 1.21
    assert value(found, "edge_telemetry_power_volts", rail="VDD_CPU_GPU_CV") == 5.04
    # a reading that failed is left out, never exported as 0
    assert ("edge_telemetry_power_watts", (("rail", "VDD_CPU_GPU_CV"),)) not in found
    assert value(found, "edge_telemetry_memory_used_bytes") == 4 << 30
    assert value(found, "edge_telemetry_memory_swap_total_bytes") == 0
    assert value(found, "edge_telemetry_cpu_load_ratio") == 0.125
    assert value(found, "edge_telemetry_cpus_online") == 4
    assert value(found, "edge_telemetry_cpu_frequency_hertz", cpu="1") == 1190400e3
    assert value(found, "edge_telemetry_process_resident_memory_bytes") == 250 << 20
    assert value(found, "edge_telemetry_power_mode_info", id=0, name="MAXN") == 1
    assert value(found, "edge_telemetry_device_info", model="NVIDIA Jetson AGX Orin", l4t="36.3.0", jetson=1) == 1
    assert value(found, "edge_telemetry_age_seconds") == 0.8
    assert not [k for k in found if "unified" in k[0] or "governor" in k[0]]


def test_telemetry_of_discrete_gpus_from_nvml():
    nvml = [{"index": 0, "name": "NVIDIA H200", "load_pct": 90.0, "memory_load_pct": 10.0, "memory_total_bytes": 1 << 37,
             "memory_used_bytes": 1 << 30, "temp_c": 40.0, "power_w": 120.5, "clock_mhz": 1980},
            {"index": 1, "name": "NVIDIA H200", "load_pct": None, "temp_c": 38.0}]
    found = _exposition(telemetry_families({"gpu": None, "nvml": nvml, "device": {"jetson": False}}))
    assert value(found, "edge_telemetry_gpu_load_ratio", gpu=0) == 0.9
    assert value(found, "edge_telemetry_gpu_frequency_hertz", gpu=0) == 1980e6
    assert value(found, "edge_telemetry_gpu_power_watts", gpu=0) == 120.5
    assert value(found, "edge_telemetry_gpu_memory_total_bytes", gpu=0) == 1 << 37
    assert value(found, "edge_telemetry_gpu_temperature_celsius", gpu=1) == 38.0
    assert ("edge_telemetry_gpu_load_ratio", (("gpu", "1"),)) not in found


@pytest.mark.parametrize("sample", [
    None, [], "telemetry", {}, {"interval_s": 5.0, "samples": 0, "pending": "no sample yet"},
    {"gpu": "ga10b", "thermal_c": [45], "power": {"VDD_IN": 6.0}, "memory": None, "cpu": {"online": 4,
     "freq_khz": [1]}, "nvml": {"0": {}}, "nvpmodel": {"id": None}, "device": "x", "age_ms": "soon"},
    {"thermal_c": {"a": float("nan"), "b": float("inf"), "c": True, "d": None}, "gpu": {"load_pct": "37"}},
])
def test_telemetry_read_defensively(sample):
    found = _exposition(telemetry_families(sample))  # never raises, and leaves out what is not a number
    assert all(math.isfinite(v) for v in found.values())
    assert not [k for k in found if k[0] in ("edge_telemetry_temperature_celsius", "edge_telemetry_gpu_load_ratio")]


# ------------------------------------------------------------------ a running server


def test_exposition_of_a_serving_server(fake_server, client):
    c = client(fake_server)
    c.embed(["a b", text_of_tokens(20)])  # buckets 8 and 32: two batches
    with pytest.raises(EdgeError):
        c.embed([""])
    c.health()
    c.stats()
    fake_server.extra_stats = lambda: {"telemetry": JETSON}  # what edge.observability.telemetry's sampler sets
    registry = registry_for(fake_server)
    found = scrape_until(lambda: render(registry), lambda f: value(f, "edge_replies_ok_total", type="stats") == 1)
    assert value(found, "edge_requests_total", type="infer") == 1
    assert value(found, "edge_requests_total", type="invalid") == 1
    assert value(found, "edge_replies_ok_total", type="stats") == 1
    assert value(found, "edge_replies_error_total", code=1005, name="EMPTY_TEXT") == 1
    assert value(found, "edge_texts_accepted_total") == 2 and total(found, "edge_batches_total") == 2
    assert value(found, "edge_batch_tokens_total", bucket=8) == 4 and value(found, "edge_batch_tokens_total",
                                                                            bucket=32) == 20
    assert value(found, "edge_request_duration_seconds_count") == 1 and value(found,
                                                                             "edge_batch_compute_seconds_count") == 2
    assert value(found, "edge_state", state="ready") == 1 and value(found, "edge_state", state="draining") == 0
    assert value(found, "edge_boot_stage_seconds", stage="load_engine") == pytest.approx(0.0275)
    assert value(found, "edge_boot_exec_to_ready_seconds") == 0.055
    info = [dict(k[1]) for k in found if k[0] == "edge_build_info"]
    assert info == [{"edge_version": "0.1.0", "edge_commit": "", "model": "fake-model", "model_sha256": "m" * 64,
                     "tokenizer_sha256": "t" * 64, "package_sha256": "p" * 64, "bundle_sha256": "",
                     "engine": "fake", "device": "cpu"}]
    assert value(found, "edge_telemetry_gpu_load_ratio", gpu="ga10b") == 0.375
    assert value(found, "edge_queue_texts", bucket=64) == 0 and value(found, "edge_admitted_texts") == 0
    assert value(found, "edge_admitted_texts_limit") == 64
    promtool_check(render(registry))


def test_queue_depth_per_bucket(make_fake_server, client):
    """Texts that arrive while a batch runs wait for a full bucket or max_delay_ms in the
    scheduler's queue: the gauge shows them there, by bucket."""
    server = make_fake_server(max_delay_ms=500.0)
    engine = server.core.engine
    engine.release.clear()  # the first batch holds the engine
    a, b = client(server), client(server)
    registry = registry_for(server)
    try:
        a.send("infer", {"texts": ["x y"]})
        assert engine.running.wait(10)
        b.send("infer", {"texts": [text_of_tokens(20), text_of_tokens(25), "p q"]})  # buckets 32, 32, 8
        scrape_until(lambda: render(registry), lambda f: value(f, "edge_admitted_texts") == 4)
    finally:
        engine.release.set()  # the loop then queues b's texts: they arrived while the engine was busy
    found = scrape_until(lambda: render(registry), lambda f: total(f, "edge_queue_texts") == 3, timeout_s=1.0)
    assert value(found, "edge_queue_texts", bucket=32) == 2 and value(found, "edge_queue_texts", bucket=8) == 1
    assert value(found, "edge_queue_texts", bucket=16) == 0
    a.recv()
    b.recv()
    found = scrape_until(lambda: render(registry), lambda f: value(f, "edge_admitted_texts") == 0)
    assert total(found, "edge_queue_texts") == 0


def test_a_failing_telemetry_source_leaves_only_its_gauges_out(fake_server):
    def broken():
        raise RuntimeError("sensor gone")

    found = samples(render(registry_for(fake_server, telemetry=broken)))
    assert value(found, "edge_state", state="ready") == 1
    assert not [k for k in found if k[0].startswith("edge_telemetry_")]


def test_the_boot_path_never_imports_prometheus_client():
    code = ("import sys, edge.boot, edge.observability.metrics.publish, edge.ipc.server, edge.serving.core; "
            "print('prometheus_client' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr


def test_docs_list_every_metric_and_no_other(fake_server, client):
    """docs/metrics.md's tables name exactly the families the runtime can expose (a full
    telemetry sample included)."""
    import re
    from pathlib import Path

    from prometheus_client.parser import text_string_to_metric_families

    client(fake_server).embed(["a b"])
    nvml = [{"index": 0, "load_pct": 1.0, "clock_mhz": 1, "temp_c": 1.0, "power_w": 1.0, "memory_used_bytes": 1,
             "memory_total_bytes": 1}]
    fake_server.extra_stats = lambda: {"telemetry": {**JETSON, "nvml": nvml}}
    registry = registry_for(fake_server)
    scrape_until(lambda: render(registry), lambda f: ("edge_padding_efficiency_ratio", ()) in f)
    exposed = set()
    for family in text_string_to_metric_families(render(registry).decode()):
        exposed.add(family.name + ("_total" if family.type == "counter" else ""))
    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `(edge_[a-z0-9_]+)` \|", doc, flags=re.M))
    assert exposed == documented, (sorted(exposed - documented), sorted(documented - exposed))
