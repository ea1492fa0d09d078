"""ONNX Runtime's telemetry stays off in the runtime (edge/engines/ort_capi.py, TELEMETRY_ENV).

ORT 1.29 and later start Microsoft's telemetry on Linux in CreateEnv: a device id and an event
cache under $HOME/.cache/Microsoft, and an uploader that resolves its collector's name some
seconds later. Two real runtimes start side by side under ``strace -e trace=connect``: one as
shipped, and a control whose environment asks for the telemetry (``ORT_DISABLE_TELEMETRY=0``,
which the runtime leaves as it is). Once the control has written its files and looked up the
collector (a state, whenever ORT's timer fires), the shipped one has run as long again and must
have done neither.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from edge.ipc.client import EdgeClient
from support.runtime_proc import start_runtime

pytestmark = pytest.mark.process

CONTROL_DEADLINE_S = 120.0  # the control's uploader looked up its collector ~9 s after the start here


def _inet_connects(trace: Path) -> list[str]:
    """The connect() calls to an address outside the machine's own sockets (AF_UNIX left out)."""
    try:
        lines = trace.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []
    return [line for line in lines if "connect(" in line and ("AF_INET" in line or "AF_INET6" in line)]


def _telemetry_files(home: Path) -> list[str]:
    return sorted(str(p.relative_to(home)) for p in (home / ".cache").rglob("*")) if (home / ".cache").exists() else []


def _traced(workdir: Path, package: Path, env: dict):
    trace = workdir / "connect.strace"
    rt = start_runtime(workdir, "--package", str(package), "--journal-dir", "off", env=env,
                       wrap=["strace", "-f", "-qq", "-e", "trace=connect", "-o", str(trace)])
    return rt, trace


def test_the_runtime_writes_no_telemetry_and_looks_up_no_collector(tmp_path, minilm_package):
    shipped, shipped_trace = _traced(tmp_path / "shipped", minilm_package, {})
    control, control_trace = _traced(tmp_path / "control", minilm_package, {"ORT_DISABLE_TELEMETRY": "0"})
    try:
        t0 = time.monotonic()
        shipped.wait_ready()
        control.wait_ready()
        for rt in (shipped, control):
            with EdgeClient(rt.address, timeout_s=30) as c:
                assert len(c.embed(["an offline appliance"]).embeddings) == 1
        while not _inet_connects(control_trace):
            assert time.monotonic() - t0 < CONTROL_DEADLINE_S, (
                f"the control never looked up the collector: {_telemetry_files(tmp_path / 'control')}")
            time.sleep(0.2)  # poll interval
        waited = time.monotonic() - t0
        time.sleep(waited)  # the shipped runtime has lived twice as long as the control needed
        assert _telemetry_files(tmp_path / "control"), "the control wrote no telemetry files"
        assert _inet_connects(shipped_trace) == [], _inet_connects(shipped_trace)
        assert _telemetry_files(tmp_path / "shipped") == []
        assert shipped.proc.poll() is None, shipped.output(tail=2000)
    finally:
        shipped.stop()
        control.stop()
