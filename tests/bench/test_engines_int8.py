"""``python -m bench.engines --package-int8 DIR``: the int8 package timed beside the full one, with the
size and speed ratios in the table, the summary line and the JSON (the existing fields unchanged)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_reports_int8_ratios(minilm_package, minilm_int8_package, tmp_path):
    out = tmp_path / "engines.json"
    cmd = [sys.executable, "-m", "bench.engines", "--package", str(minilm_package), "--package-int8",
           # 6 large runs in 3 bursts whose order rotates: a median that one busy call does not move, and drift
           # in the machine's load (a full suite beside it) hits both models alike (1 burst each measured 1.006 once)
           str(minilm_int8_package), "--runs-small", "3", "--runs-large", "6", "--rounds", "3", "--no-variants",
           "--json", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(out.read_text())
    # The contract of the existing record stands.
    assert {"time", "package", "cpus", "load_avg", "records", "goals_met"} <= set(record)
    kinds = [r["kind"] for r in record["records"]]
    assert kinds == ["sentence-transformers", "onnxruntime", "torchscript", "onnxruntime-int8"]
    int8 = record["int8"]
    assert int8["package"] == str(minilm_int8_package)
    full_ort = minilm_package / "model.ort"
    assert int8["full_model_bytes"] == full_ort.stat().st_size
    assert int8["model_bytes"] == (minilm_int8_package / "model.ort").stat().st_size
    assert 0 < int8["size_ratio"] < 0.6
    assert set(int8["speed_ratio"]) == set(int8["cpu_speed_ratio"]) == {"1x32", "32x128"}
    by_kind = {r["kind"]: r for r in record["records"]}
    for shape, ratio in int8["speed_ratio"].items():
        assert ratio == by_kind["onnxruntime-int8"]["latency"][shape]["median_ms"] / \
            by_kind["onnxruntime"]["latency"][shape]["median_ms"]
    # Faster on this CPU at the large batch: CPU time per call, which other load sways least.
    assert int8["cpu_speed_ratio"]["32x128"] < 1.0, int8
    assert int8["cosine_min"] >= 0.99
    lines = proc.stdout.splitlines()
    summary = next(line for line in lines if line.startswith("engines: "))
    assert re.search(r"int8 / full \(onnxruntime\): size x0\.\d\d, 1x32 x\d+\.\d\d \(cpu x\d+\.\d\d\), "
                     r"32x128 x\d+\.\d\d", summary), summary
    assert "goals of the default engines" in summary  # unchanged, and still judged on the default engines only
    assert any(line.startswith("onnxruntime-int8 ") for line in lines)  # its row in the table
