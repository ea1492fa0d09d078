"""The runtime as users run it (``python -m edge.boot``): ``stats`` carries ``telemetry`` once
the sampler has read, and none with ``--telemetry-interval 0``."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import edge.observability.telemetry

from edge.ipc.client import EdgeClient
from edge.system.readiness import NotifiedProcess

BOOT_DEADLINE_S = 120.0


def _runtime(workdir, package, *args) -> tuple[NotifiedProcess, str]:
    workdir.mkdir(parents=True, exist_ok=True)
    address = f"ipc://{workdir}/run/edge.sock"
    cmd = [sys.executable, "-m", "edge.boot", "--package", str(package), "--engine", "onnxruntime", "--bind", address,
           "--timeline", str(workdir / "timeline.json"), *args]
    proc = NotifiedProcess(cmd, notify_path=workdir / "notify.sock", log_path=workdir / "runtime.log",
                           env={**os.environ, "HOME": str(workdir)})
    return proc, address


def test_stats_carries_telemetry(minilm_package, tmp_path):
    proc, address = _runtime(tmp_path / "on", minilm_package, "--telemetry-interval", "0.2")
    with proc:
        proc.wait_ready(BOOT_DEADLINE_S)
        with EdgeClient(address, timeout_s=30) as client:
            deadline = time.monotonic() + 20
            while (t := client.stats().get("telemetry", {})).get("samples", 0) < 2:
                assert time.monotonic() < deadline, f"no second sample in 20 s: {t}\n{proc.output()}"
                time.sleep(0.05)
            assert t["interval_s"] == 0.2 and t["age_ms"] < 5000
            assert t["sources"]["sysfs"] == "ok"
            assert t["memory"]["total_bytes"] > 0 and t["process"]["rss_bytes"] > 0
            assert t["process"]["threads"] >= 4  # main, I/O, engine loop, tokenizer stage, edge-telemetry...
            for key, value in t.items():  # None only with a reason
                if value is None:
                    assert any(k.split(".")[0] in (key, key.split("_")[0]) for k in t["absent"]), key
            assert client.embed("the sampler does not get in the way").embeddings.shape == (1, 384)
    assert proc.proc.returncode == 0, proc.output()


def test_stats_without_telemetry(minilm_package, tmp_path):
    proc, address = _runtime(tmp_path / "off", minilm_package, "--telemetry-interval", "0")
    with proc:
        proc.wait_ready(BOOT_DEADLINE_S)
        with EdgeClient(address, timeout_s=30) as client:
            stats = client.stats()
    assert "telemetry" not in stats and stats["state"] == "ready"


def test_boot_path_imports_no_telemetry():
    """edge.boot imports edge.observability.telemetry only after READY (and not at all with the interval at 0)."""
    probe = "import sys, edge.boot; print(sorted(m for m in sys.modules if m.startswith('edge.observability.telemetry')))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_public_names():
    assert edge.observability.telemetry.__all__ == ["DEFAULT_INTERVAL_S", "JtopSource", "NvmlSource", "Sampler", "read_all",
                                      "start_sampler"]
    for name in edge.observability.telemetry.__all__:
        assert getattr(edge.observability.telemetry, name) is not None, name
