"""``edge serve --snapshot-point``: the runtime waits before bind, then goes on after SIGUSR2,
as itself (a plain resume) or as a restored copy (the restorer's resume file says so).

The checkpoint itself (runc checkpoint / restore, CRIU) is tested with the bundle; here the
runtime's side of the contract: the marker, the wait, the restore hook and the timeline.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

from edge.errors import ErrorCode
from edge.ipc.client import EdgeClient
from edge.runtime.snapshot import MARKER, RESUME, RESUME_SIGNAL

from support.runtime_proc import start_runtime


def _wait_for_marker(rt, timeout_s: float = 60.0) -> dict:
    marker = rt.workdir / "run" / MARKER
    deadline = time.monotonic() + timeout_s
    while not marker.exists():
        assert rt.proc.poll() is None, rt.output()
        assert time.monotonic() < deadline, f"no {MARKER} within {timeout_s} s\n{rt.output()}"
        time.sleep(0.02)
    return json.loads(marker.read_text())


def _start(tmp_path: Path, package: Path):
    (tmp_path / "run").mkdir(parents=True)
    return start_runtime(tmp_path, "--package", str(package), "--snapshot-point",
                         "--timeline", str(tmp_path / "run" / "timeline.json"))


def _resume(rt, marker: dict, restored: bool) -> None:
    if restored:
        record = {"restored": True, "restore_started_realtime_ns": time.clock_gettime_ns(time.CLOCK_REALTIME)}
        (rt.workdir / "run" / RESUME).write_text(json.dumps(record))
    os.kill(marker["pid"], RESUME_SIGNAL)


def test_the_runtime_waits_before_bind_and_a_plain_resume_serves(minilm_package, tmp_path):
    rt = _start(tmp_path, minilm_package)
    try:
        marker = _wait_for_marker(rt)
        stages = [s["stage"] for s in marker["timeline"]["stages"]]
        assert {"import_server", "load_tokenizer", "warm_buckets"} <= set(stages) and "bind" not in stages
        # ONNX Runtime packs its weights here, once, for every restore (--ort-prepacking auto)
        assert next(s for s in marker["timeline"]["stages"] if s["stage"] == "load_engine")["prepacking"] is True
        settled = next(s for s in marker["timeline"]["stages"] if s["stage"] == "settle_for_snapshot")
        assert settled["objects_frozen"] > 10_000 and 0 < settled["anon_after_bytes"] <= settled["anon_before_bytes"]
        assert {Path(f["path"]).name for f in marker["files"]} >= {"tokenizer.fb", "manifest.json", "model.ort"}
        assert not Path(rt.address[len("ipc://"):]).exists()  # nothing bound yet: no client can depend on it
        time.sleep(0.3)
        assert rt.proc.poll() is None  # still waiting
        _resume(rt, marker, restored=False)
        rt.wait_ready()
        with EdgeClient(rt.address) as c:
            assert c.embed(["after a plain resume"]).embeddings.shape == (1, 384)
        timeline = json.loads((tmp_path / "run" / "timeline.json").read_text())
        assert timeline["start"] == "fresh" and "snapshot_wait" in [s["stage"] for s in timeline["stages"]]
    finally:
        rt.stop()


def test_a_restored_runtime_reseeds_checks_its_files_and_says_restored(minilm_package, tmp_path):
    rt = _start(tmp_path, minilm_package)
    try:
        marker = _wait_for_marker(rt)
        _resume(rt, marker, restored=True)
        rt.wait_ready()
        with EdgeClient(rt.address) as c:
            first = c.embed(["after a restore"]).meta["trace_id"]
            assert c.embed(["after a restore"]).meta["trace_id"] != first
        timeline = json.loads((tmp_path / "run" / "timeline.json").read_text())
        stages = [s["stage"] for s in timeline["stages"]]
        assert timeline["start"] == "restored" and stages[:2] == ["restore", "restore_hook"], stages
        assert stages[-2:] == ["bind", "start"] and timeline["exec_to_ready_ms"] < 1000
        assert "warm_buckets" in [s["stage"] for s in timeline["snapshot"]["stages"]]
    finally:
        rt.stop()


def test_a_file_changed_since_the_snapshot_is_refused_as_stale(minilm_package, tmp_path):
    package = tmp_path / "pkg"
    shutil.copytree(minilm_package, package)
    rt = _start(tmp_path / "rt", package)
    try:
        marker = _wait_for_marker(rt)
        os.utime(package / "tokenizer.fb", ns=(0, 10**18))  # what a re-copied package looks like
        _resume(rt, marker, restored=True)
        assert rt.proc.wait(30) == 3
        out = rt.output()
        assert ErrorCode.SNAPSHOT_STALE.name in out and "tokenizer.fb changed since the snapshot" in out, out
    finally:
        rt.stop()


def test_a_stop_signal_at_the_snapshot_point_exits_0(minilm_package, tmp_path):
    rt = _start(tmp_path, minilm_package)
    try:
        _wait_for_marker(rt)
        rt.proc.send_signal(signal.SIGTERM)
        assert rt.proc.wait(30) == 0, rt.output()
    finally:
        rt.stop()
