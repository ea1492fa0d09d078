"""``edge top``: the view model's arithmetic on synthetic ``stats`` snapshots, the rendering into a
recorded console, the poll loop against a scripted poller, and ``--once`` against a real server
process (tests/support/serve_fake.py)."""

from __future__ import annotations

import argparse
import random
import re
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest

from edge.commands import top as T
from edge.commands import top_model as M
from edge.serving.metrics import LATENCY_BOUNDS_MS, Histogram
from support.fake_server import ServerProcess

try:
    from rich.console import Console

    from edge.commands.top_view import render
except ImportError:  # rich is the optional extra edge[top]: only the rendering needs it
    Console = render = None
needs_rich = pytest.mark.skipif(render is None, reason="rich (pip install 'edge[top]') is not installed")

ADDRESS = "ipc:///run/edge/edge.sock"
BOUNDS = list(LATENCY_BOUNDS_MS)


def hist(values: list[float]) -> Histogram:
    h = Histogram()
    for v in values:
        h.observe(v)
    return h


def snap(uptime_s: float, infer: int, texts: int, latency: dict, sizes: dict, by_bucket: dict, **extra) -> dict:
    """A stats reply of the shape edge/ipc/server.py sends (Metrics.snapshot() at the top level)."""
    return {
        "uptime_s": uptime_s, "requests": {"infer": infer, "stats": 7}, "replies_ok": {"infer": infer},
        "texts_accepted": texts, "errors_total": extra.pop("errors", 0), "replies_dropped": 0,
        "latency_ms": {name: h.snapshot() for name, h in latency.items()},
        "batches": {"count": sum(sizes.values()), "sizes": {str(k): n for k, n in sizes.items()},
                    "padding_efficiency": extra.pop("padding_efficiency", None), "by_bucket": by_bucket},
        "state": "ready",
        "queue": {"texts": 5, "max_texts": 256, "tokens": 160, "max_queued_tokens": 16384, "in_flight": 2,
                  "pending_text_bytes": 0, "max_pending_text_bytes": 32 << 20},
        "lineage": {"model": "all-MiniLM-L6-v2", "engine": "onnxruntime", "device": "cuda", "bundle_sha256": "b" * 64,
                    "package_sha256": "9f" * 32, "edge_version": "0.1.0"},
        "settings": {"buckets": [8, 32], "batch_caps": {"8": 8, "32": 4}},
        "connections": {"open": 3, "cap": 4096}, **extra,
    }


def two_snapshots(telemetry=None) -> tuple[dict, dict]:
    """10 s and 12 s after boot: 40 infer requests (120 texts) in between, 10 batches of 8 in bucket 8."""
    q, c, t = hist([0.3] * 50 + [0.8] * 50), hist([0.9] * 75), hist([3.0] * 50 + [7.0] * 50)
    a = snap(10.0, 100, 300, {"queue": q, "compute": c, "total": t}, {2: 50, 4: 25},
             {"8": {"batches": 60, "texts": 200, "tokens": 800, "padded_tokens": 1600},
              "32": {"batches": 15, "texts": 60, "tokens": 960, "padded_tokens": 1920}}, padding_efficiency=0.5)
    for v in [40.0] * 40:  # the interval's requests all waited 20..50 ms
        q.observe(v)
        t.observe(v + 5)
    for v in [1.5] * 10:
        c.observe(v)
    extra = {} if telemetry is None else {"telemetry": telemetry}
    b = snap(12.0, 140, 420, {"queue": q, "compute": c, "total": t}, {2: 50, 4: 25, 8: 10},
             {"8": {"batches": 70, "texts": 280, "tokens": 1400, "padded_tokens": 2240},
              "32": {"batches": 15, "texts": 60, "tokens": 960, "padded_tokens": 1920}},
             padding_efficiency=0.5876, errors=3, **extra)
    return a, b


def text_of(view: M.View, width: int = 120) -> str:
    console = Console(record=True, width=width)
    console.print(render(view))
    return console.export_text()


# ------------------------------------------------------------------ view model


def test_quantile_matches_the_servers_histogram():
    rng = random.Random(15)
    for _ in range(200):
        h = hist([rng.choice([0.05, 0.3, 4.0, 77.0, 20000.0]) * rng.random() for _ in range(rng.randint(0, 40))])
        for q in M.QUANTILES:
            assert M.quantile(BOUNDS, h.counts, q, h.max) == h.quantile(q)


def test_interval_percentiles_are_those_of_the_interval_alone():
    rng = random.Random(3)
    before = [rng.uniform(0, 3) for _ in range(500)]
    during = [rng.uniform(10, 400) for _ in range(37)]
    h = hist(before)
    first = h.snapshot()
    for v in during:
        h.observe(v)
    got = M.interval_histogram(first, h.snapshot())
    alone = hist(during)
    assert (got.p50, got.p95, got.p99, got.count) == (alone.quantile(0.5), alone.quantile(0.95),
                                                      alone.quantile(0.99), 37)
    assert M.interval_histogram(None, h.snapshot()) == M.Latency()
    assert M.interval_histogram(first, first) == M.Latency(count=0)


def test_rates_fill_and_padding_over_the_interval():
    a, b = two_snapshots()
    v = M.build_view(a, b, 2.4, ADDRESS)
    assert v.interval_s == 2.0  # the server's uptime delta, not the client's 2.4 s
    assert (v.requests, v.texts, v.batches, v.errors) == (140, 420, 85, 3)
    assert v.requests_per_s == 20.0 and v.texts_per_s == 60.0 and v.batches_per_s == 5.0 and v.errors_per_s == 1.5
    assert v.latency["queue"] == M.Latency(1.0, 50.0, 50.0, 140)  # since boot: the server's own p50/p95/p99
    assert v.latency_interval["queue"] == M.Latency(50.0, 50.0, 50.0, 40)
    assert v.latency_interval["compute"] == M.Latency(2.0, 2.0, 2.0, 10)
    assert v.latency_interval["total"].count == 40
    assert v.texts_per_batch == pytest.approx((100 + 100 + 80) / 85)
    assert v.texts_per_batch_interval == 8.0 and v.max_batch == 8
    assert v.fill == pytest.approx((280 + 60) / (70 * 8 + 15 * 4))
    assert v.fill_interval == 1.0  # 80 texts in 10 batches of 8 rows
    assert v.padding_efficiency == 0.5876 and v.padding_efficiency_interval == pytest.approx(600 / 640)
    rows = {r.bucket: r for r in v.buckets}
    assert rows[8] == M.BucketRow(8, 8, 70, 280, 0.5, 1.0, 1400 / 2240, None)
    assert rows[32].fill == 1.0 and rows[32].fill_interval is None  # no batch in the interval
    assert v.lineage == {"model": "all-MiniLM-L6-v2", "engine": "onnxruntime", "device": "cuda",
                         "edge_version": "0.1.0", "bundle": "bbbbbbbbbbbb", "package": "9f9f9f9f9f9f"}
    assert not v.device.present and v.device.gpu_load_pct is None


def test_first_poll_and_restart_have_no_rates():
    a, b = two_snapshots()
    for prev, cur in ((None, b), (b, a)):  # b then a: uptime went back, the server restarted
        v = M.build_view(prev, cur, 2.0, ADDRESS)
        assert v.interval_s is None and v.requests_per_s is None and v.fill_interval is None
        assert v.latency_interval["total"] == M.Latency() and v.requests == cur["requests"]["infer"]
    no_uptime = [{k: x for k, x in s.items() if k != "uptime_s"} for s in (a, b)]
    assert M.build_view(*no_uptime, 4.0, ADDRESS).requests_per_s == 10.0  # then the client's clock


@needs_rich
def test_an_empty_or_odd_reply_does_not_break_the_view():
    for cur in ({}, {"latency_ms": {"queue": None}, "batches": {"sizes": {"x": "y"}, "by_bucket": {"8": 3}},
                     "telemetry": "off", "lineage": None, "queue": [1]}):
        v = M.build_view(cur, cur, 1.0, ADDRESS)
        assert v.requests == 0 and v.texts_per_batch is None
        assert "—" in text_of(v)


JETSON = {  # the shape of edge/observability/telemetry/sampler.py read_all() on an Orin
    "gpu": {"devfreq": "17000000.gpu", "name": "gpu", "load_pct": 37.0, "cur_freq_hz": 918000000},
    "thermal_c": {"gpu-thermal": 41.5, "cpu-thermal": 44.0},
    "power": {"VDD_IN": {"voltage_mv": 5000, "current_ma": 1240, "power_w": 6.2},
              "VDD_CPU_GPU_CV": {"voltage_mv": 5000, "current_ma": 420, "power_w": 2.1},
              "VDD_SOC": {"voltage_mv": 5000, "current_ma": None, "power_w": None}},
    "memory": {"total_bytes": 8 << 30, "available_bytes": 5 << 30, "used_bytes": 3 << 30, "unified": True},
    "nvpmodel": {"id": 0, "name": "MAXN", "default_id": 2}, "cpu": {"online": [0, 1], "load_pct": 12.5},
    "nvml": None, "jtop": None, "absent": {"nvml": "off on a Jetson"}, "age_ms": 120.0,
}
DISCRETE = {"gpu": None, "thermal_c": None, "power": None, "memory": {"total_bytes": 64 << 30, "used_bytes": None},
            "nvml": [{"index": 0, "name": "H200", "load_pct": 80.0, "memory_total_bytes": 141 << 30,
                      "memory_used_bytes": 20 << 30, "temp_c": 35.0, "power_w": 300.5, "clock_mhz": 1980}]}


def test_telemetry_is_read_defensively():
    assert M.device_view(None) == M.DeviceView()
    assert M.device_view({}) == M.DeviceView(present=True)
    j = M.device_view(JETSON)
    assert (j.gpu_load_pct, j.gpu_clock_mhz, j.cpu_load_pct, j.power_mode) == (37.0, 918.0, 12.5, "MAXN")
    assert j.temperatures_c == {"gpu-thermal": 41.5, "cpu-thermal": 44.0}
    assert j.power_total_w == 6.2 and j.power_w == {"VDD_CPU_GPU_CV": 2.1}  # VDD_IN is the total; SOC unread
    assert (j.memory_used_bytes, j.memory_total_bytes) == (3 << 30, 8 << 30)
    assert j.gpu_memory_used_bytes is None and j.pending is None
    d = M.device_view(DISCRETE)
    assert (d.gpu_load_pct, d.gpu_clock_mhz, d.power_total_w, d.temperatures_c) == (80.0, 1980, 300.5, {"gpu": 35.0})
    assert (d.gpu_memory_used_bytes, d.gpu_memory_total_bytes) == (20 << 30, 141 << 30)
    assert (d.memory_used_bytes, d.memory_total_bytes, d.cpu_load_pct) == (None, 64 << 30, None)
    odd = M.device_view({"gpu": {"load_pct": True}, "power": [1], "thermal_c": {"x": "hot"}, "nvml": [None],
                         "memory": {"used_bytes": "3G"}, "pending": "no sample yet"})
    assert odd == M.DeviceView(pending="no sample yet", present=True)


def test_telemetry_of_this_host_reads():
    sampler = pytest.importorskip("edge.observability.telemetry.sampler")
    d = M.device_view(sampler.read_all("/", jtop=None, nvml=None))
    assert d.present and d.pending is None
    assert d.memory_total_bytes and d.memory_total_bytes > 0  # /proc/meminfo is on every Linux


def test_queue_depth_per_bucket_when_the_server_sends_it():
    a, b = two_snapshots()
    b["queue"]["by_bucket"] = {"8": 3, "32": {"texts": 2}}
    assert [r.queued for r in M.build_view(a, b, 2.0, ADDRESS).buckets] == [3, 2]


# ------------------------------------------------------------------ rendering


@needs_rich
def test_render_shows_the_numbers():
    a, b = two_snapshots(telemetry=JETSON)
    text = text_of(M.build_view(a, b, 2.0, ADDRESS))
    lines = text.splitlines()
    assert ADDRESS in lines[0] and "ready" in lines[0] and "up 0:00:12" in lines[0] and "last 2.0 s" in lines[0]
    assert "all-MiniLM-L6-v2" in text and "onnxruntime" in text and "bundle bbbbbbbbbbbb" in text
    assert re.search(r"infer requests\s+140\s+20\.0", text)
    assert re.search(r"texts\s+420\s+60\.0", text) and re.search(r"errors\s+3\s+1\.5", text)
    assert re.search(r"queue\s+1\s+50\s+50\s+140\s+50\s+50\s+50\s+40", text)
    assert re.search(r"compute\s+1\s+2\s+2\s+85\s+2\s+2\s+2\s+10", text)
    assert re.search(r"texts/batch\s+3\.3 of 8\s+8\.0", text)
    assert re.search(r"batch fill\s+55%\s+100%", text) and re.search(r"padding eff\s+59%\s+94%", text)
    assert re.search(r"queued texts\s+5/256", text) and re.search(r"in flight\s+2", text)
    assert re.search(r"^8\s+—\s+8\s+70\s+280\s+50%\s+100%\s+62%", text, re.M)
    assert re.search(r"GPU load\s+37% at 918 MHz", text) and re.search(r"CPU load\s+12%", text)
    assert re.search(r"memory\s+3\.0 GiB / 8\.0 GiB", text) and "GPU memory" not in text  # unified on a Jetson
    assert "6.20 W  (VDD_CPU_GPU_CV 2.10 W)  mode MAXN" in text
    assert "gpu-thermal 41.5 °C  cpu-thermal 44.0 °C" in text
    text = text_of(M.build_view(a, {**b, "telemetry": DISCRETE}, 2.0, ADDRESS))
    assert re.search(r"GPU memory\s+20\.0 GiB / 141\.0 GiB", text) and re.search(r"power\s+300\.50 W", text)
    assert re.search(r"memory\s+— / 64\.0 GiB", text)
    text = text_of(M.build_view(a, {**b, "telemetry": {"interval_s": 5.0, "pending": "no sample yet"}}, 2.0, ADDRESS))
    assert "device (no sample yet)" in text and re.search(r"GPU load\s+—", text)


@needs_rich
def test_render_without_telemetry_and_at_80_columns():
    a, b = two_snapshots()
    text = text_of(M.build_view(a, b, 2.0, ADDRESS), width=80)
    assert "device (stats carry no telemetry)" in text
    assert re.search(r"GPU load\s+—", text) and re.search(r"temperatures\s+—", text)
    assert re.search(r"infer requests\s+140\s+20\.0", text)  # nothing cut at 80 columns
    assert max(len(line) for line in text.splitlines()) <= 80


@needs_rich
def test_render_says_when_the_server_does_not_answer():
    a, b = two_snapshots()
    last = M.build_view(a, b, 2.0, ADDRESS)
    for view in (M.no_answer_view(ADDRESS, None, f"no answer from {ADDRESS} (retrying): no reply within 5 s"),
                 M.no_answer_view(ADDRESS, last, f"no answer from {ADDRESS} (retrying): no reply within 5 s")):
        assert f"no answer from {ADDRESS} (retrying)" in text_of(view)
    kept = M.no_answer_view(ADDRESS, last, "x")
    assert kept.requests == 140 and kept.requests_per_s is None and kept.interval_s is None and not kept.answered
    text = text_of(kept)  # the last numbers since boot stay; nothing claims to be of the last interval
    assert re.search(r"infer requests\s+140\s+—", text) and re.search(r"batch fill\s+55%\s+—", text)
    assert re.search(r"queue\s+1\s+50\s+50\s+140\s+—\s+—\s+—\s+—", text)


# ------------------------------------------------------------------ the loop and the command


def test_frames_retry_and_rates_resume():
    a, b = two_snapshots()
    answers = iter([(None, "its socket file does not exist"), (a, ""), (b, ""), (None, "no reply within 1 s")])
    poller = SimpleNamespace(address=ADDRESS, poll=lambda: next(answers))
    frames = T._frames(poller, 1.0, sleep=lambda s: None)
    views = [next(frames) for _ in range(4)]
    assert not views[0].answered and views[0].problem == f"no answer from {ADDRESS} (retrying): its socket file " \
                                                         f"does not exist"
    assert views[1].answered and views[1].requests_per_s is None
    assert views[2].requests_per_s == 20.0
    assert not views[3].answered and views[3].requests == 140


def test_options():
    p = argparse.ArgumentParser()
    T.add_arguments(p)
    assert vars(p.parse_args([])) == {"interval": 1.0, "once": False, "no_color": False}
    assert p.parse_args(["--interval", "0.5", "--once", "--no-color"]).interval == 0.5
    with pytest.raises(SystemExit):
        p.parse_args(["--interval", "0"])


def _args(**kw) -> SimpleNamespace:
    return SimpleNamespace(**{"interval": 0.2, "once": True, "no_color": True, "timeout": 5.0, **kw})


def test_without_rich_exit_2_naming_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "rich.live", None)  # import rich.live raises ImportError
    assert T.run(_args(), "ipc:///nonexistent/edge.sock", None) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1 and "edge[top]" in out.err


@needs_rich
def test_once_without_a_server_exits_2_with_one_line(tmp_path, capsys):
    address = f"ipc://{tmp_path}/edge.sock"
    assert T.run(_args(), address, None) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1
    assert out.err.startswith(f"edge top: no answer from {address}: its socket file does not exist")
    assert T.run(_args(timeout=0.2), "tcp://127.0.0.1:9", None) == 2  # nothing listens: a timeout
    assert "no reply within 0.2 s" in capsys.readouterr().err


@pytest.fixture(scope="module")
def server():
    s = ServerProcess()
    try:
        yield s
    finally:
        s.kill()


def _with_load(server, body):
    """Run ``body()`` while a thread sends infer requests; (body's result, requests sent)."""
    from edge.ipc.client import EdgeClient

    stop, sent = threading.Event(), [0]

    def load():
        with EdgeClient(server.address) as client:
            while not stop.is_set() or sent[0] < 5:
                client.embed(["a short text", "and a longer one with a few more words"])
                sent[0] += 1

    thread = threading.Thread(target=load)
    thread.start()
    try:
        return body(), sent[0]
    finally:
        stop.set()
        thread.join(30)


@needs_rich
def test_once_against_a_real_server(server, capsys):
    code, sent = _with_load(server, lambda: T.run(_args(interval=0.3), server.address, None))
    out = capsys.readouterr()
    assert code == 0 and out.err == "", out.err
    m = re.search(r"infer requests\s+(\d+)\s+([\d.]+)", out.out)
    assert m, out.out
    assert int(m.group(1)) >= 1 and float(m.group(2)) > 0, out.out
    assert re.search(r"texts\s+[1-9]\d*\s+[\d.]*[1-9]", out.out) and "ready" in out.out.splitlines()[0]
    assert "\x1b[" not in out.out  # --no-color, and not a terminal


@needs_rich
def test_edge_top_command_once(server):
    from edge import cli

    sub = next(a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction))
    if "top" not in sub.choices:
        pytest.skip("edge/cli.py does not wire `edge top` yet (edge.commands.top.add_arguments and run)")
    code, _ = _with_load(server, lambda: subprocess.run(
        [sys.executable, "-m", "edge.cli", "top", "--once", "--interval", "0.3", "--connect", server.address],
        capture_output=True, text=True, timeout=60))
    assert code.returncode == 0, code.stderr
    assert re.search(r"infer requests\s+[1-9]\d*\s+[\d.]*[1-9]", code.stdout), code.stdout
