import subprocess
import sys
import time

from edge.runtime.timeline import Timeline, exec_boottime_s


def test_stages_are_ordered_and_measured():
    tl = Timeline()
    with tl.stage("a"):
        time.sleep(0.02)
    with tl.stage("b", note="x"):
        pass
    ready = tl.mark_ready()
    d = tl.as_dict()
    names = [s["stage"] for s in d["stages"]]
    assert names == ["a", "b"]
    a, b = d["stages"]
    assert a["duration_ms"] >= 19
    assert a["end_ms"] <= b["start_ms"] <= b["end_ms"] <= ready
    assert b["note"] == "x"
    assert d["exec_to_ready_ms"] == ready


def test_stage_is_recorded_even_when_it_fails():
    tl = Timeline()
    try:
        with tl.stage("boom"):
            raise ValueError("x")
    except ValueError:
        pass
    assert [s["stage"] for s in tl.as_dict()["stages"]] == ["boom"]


def test_exec_time_precedes_python_start():
    # A fresh interpreter reports ms since exec that cover its own start-up:
    # positive, and not absurdly large.
    code = "from edge.runtime.timeline import Timeline; print(Timeline().now_ms())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    ms = float(out.stdout)
    assert 0 < ms < 10_000


def test_exec_hint_from_launcher(monkeypatch):
    now_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    monkeypatch.setenv("EDGE_EXEC_BOOTTIME_NS", str(now_ns - 250_000_000))
    assert abs(exec_boottime_s() - (now_ns / 1e9 - 0.25)) < 1e-6
    assert 250 <= Timeline().now_ms() < 1250
