"""edge-coldstart --snapshot: the summary of restores against fresh starts, the open-files limit
a container gets here, and one short real run against the MiniLM ONNX Runtime bundle.

The real run works on a private copy of the cached bundle's config (its own socket directory,
so no other test's container answers for it) in a directory others can search (a restore runs
as an unprivileged host uid: pytest's 0700 basetemp will not do); the rootfs is the cached
bundle's, read-only. Figures are not asserted (they belong in docs/coldstart.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bench.coldstart import launch as L
from bench.coldstart import report as R
from bench.coldstart import snapshot_runs as SR

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


# ------------------------------------------------------------------ summary and limits


def _run(total: float) -> dict:
    return {"total_ms": total, "phases": {}, "timeline": None}


def test_snapshot_summary_medians_and_ratio():
    pairs = [{"i": 1, "runtime": _run(200.0), "fresh": _run(500.0)},
             {"i": 2, "runtime": _run(300.0), "fresh": _run(450.0)},
             {"i": 3, "runtime": _run(250.0)}]  # a failed fresh run: no pair ratio, the restore still counts
    s = R.snapshot_summary(pairs, {"image_mib": 39.2, "take_s": None})
    assert s["restore_median_ms"] == 250.0 and s["fresh_median_ms"] == 475.0
    assert s["ratio_fresh_over_restore"] == 1.9  # of the medians
    assert s["ratios_fresh_over_restore"] == [2.5, 1.5]
    assert s["snapshot_image_mib"] == 39.2 and s["snapshot_taken_s"] is None
    empty = R.snapshot_summary([], None)
    assert empty["restore_median_ms"] is None and empty["ratio_fresh_over_restore"] is None


def test_the_verdict_names_what_it_measured():
    ok, line = R.verdict(246.0, 1500.0, 0, "restore to first reply")
    assert ok and line == "PASS: restore to first reply 246 ms (median) within the budget of 1500 ms"
    assert R.verdict(246.0, 1500.0)[1].startswith("PASS: exec to first reply")


def _fake_bundle(tmp_path: Path, nofile: int) -> Path:
    b = tmp_path / "b"
    b.mkdir()
    (b / "config.json").write_text(json.dumps({
        "root": {"path": "rootfs"}, "process": {"rlimits": [{"type": "RLIMIT_NOFILE", "hard": nofile, "soft": nofile}]},
        "mounts": [{"destination": "/x", "type": "bind", "source": "files/x"}]}))
    (b / "edge-bundle.json").write_text("{}")
    return b


def test_runnable_bundle_lowers_only_the_limit(tmp_path):
    b = _fake_bundle(tmp_path, 65536)
    assert SR.container_nofile(b, 1000) == (1000, "--nofile 1000")
    assert SR.container_nofile(b, 70000) == (None, None)  # never raised above the bundle's own
    assert SR.runnable_bundle(b, tmp_path / "w", None) == b
    copy = SR.runnable_bundle(b, tmp_path / "w", 1000)
    config = json.loads((copy / "config.json").read_text())
    assert config["process"]["rlimits"] == [{"type": "RLIMIT_NOFILE", "hard": 1000, "soft": 1000}]
    assert config["root"]["path"] == str(b.resolve() / "rootfs")
    assert config["mounts"][0]["source"] == str(b.resolve() / "files/x")
    assert (copy / "edge-bundle.json").read_text() == "{}"
    assert json.loads((b / "config.json").read_text())["process"]["rlimits"][0]["hard"] == 65536  # untouched


# ------------------------------------------------------------------ one short real run


def _coldstart(bundle: Path, out: Path, runs: int) -> tuple[subprocess.CompletedProcess, dict]:
    cmd = [sys.executable, "-m", "bench.coldstart.cli", "--snapshot", "--bundle", str(bundle), "--runs", str(runs),
           "--no-baseline", "--budget-ms", "1e9", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=out.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, json.loads(out.read_text())


@pytest.fixture(scope="module")
def snapshot_run(ort_bundle):
    from support.bundles import private_bundle, runc_or_skip

    runc_or_skip()
    work = Path(tempfile.mkdtemp(prefix="edge-cs-snap-", dir="/tmp"))
    os.chmod(work, 0o711)
    try:
        bundle = private_bundle(ort_bundle, work)
        first = _coldstart(bundle, work / "record.json", runs=2)
        again = _coldstart(bundle, work / "again.json", runs=1)  # the snapshot is there now: reused
        yield work, bundle, first, again
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_real_snapshot_run_summary(snapshot_run):
    _, _, (proc, rec), _ = snapshot_run
    s = rec["summary"]
    for key in ("restore_median_ms", "restore_p95_ms", "fresh_median_ms", "ratio_fresh_over_restore",
                "snapshot_image_mib", "median_ms", "p95_ms"):
        assert s[key] is not None and s[key] > 0, key
    assert s["median_ms"] == s["restore_median_ms"]  # the verdict judges the restores
    assert s["pass"] is True and s["failed_runs"] == 0 and len(s["ratios_fresh_over_restore"]) == 2
    assert s["verdict"].startswith("PASS: restore to first reply")
    assert proc.stdout.strip().splitlines()[-1] == s["verdict"]
    assert "[1/2] snapshot" in proc.stderr and "fresh" in proc.stderr
    assert rec["config"]["mode"] == "snapshot" and rec["config"]["snapshot"] is True
    assert {"runtime", "fresh"} <= set(rec["phases"]) and "restore" in rec["phases"]["runtime"]
    # The restore's phases, from CRIU's log of each real restore: they add up inside the restore call.
    ph = s["restore_phases_median_ms"]
    assert 0 < ph["criu_setup_ms"] + ph["criu_memory_ms"] + ph["criu_finish_ms"] <= ph["criu_total_ms"] + 0.5
    assert ph["outside_criu_ms"] > 0 and "restore phases, median ms: outside criu" in proc.stdout
    for pair in rec["runs"]:
        criu = pair["runtime"]["reply"]["criu"]
        assert criu["criu_total_ms"] < pair["runtime"]["reply"]["restore_call_ms"]
        assert criu["pages_restored_bytes"] <= s["snapshot_image_mib"] * 2**20 + 1  # the pages image, read once


def test_real_snapshot_run_restores_and_fresh_starts_alternate(snapshot_run):
    _, _, (_, rec), _ = snapshot_run
    assert [p["i"] for p in rec["runs"]] == [1, 2]
    for pair in rec["runs"]:
        restore, fresh = pair["runtime"], pair["fresh"]
        assert restore["kind"] == "restore" and fresh["kind"] == "bundle"
        assert restore["cosine"] >= L.MIN_COSINE and fresh["cosine"] >= L.MIN_COSINE  # the embeddings check
        t = restore["timeline"]
        assert t["start"] == "restored" and fresh["timeline"]["start"] == "fresh"
        stages = [st["stage"] for st in t["stages"]]
        assert stages[:2] == ["restore", "restore_hook"] and {"bind", "start"} <= set(stages)
        assert "warm_buckets" in [st["stage"] for st in t["snapshot"]["stages"]]  # the snapshot's own boot
        # One clock: the restore began at (or just after) our clock's start, READY before the reply.
        assert 0 <= restore["phases"]["restore"][0] < 50
        assert 0 < t["exec_to_ready_ms"] <= restore["total_ms"]


def test_real_snapshot_is_taken_once_then_reused(snapshot_run):
    work, bundle, (_, rec), (_, again) = snapshot_run
    snap = rec["snapshot"]
    assert snap["taken"] is True and snap["take_s"] > 0 and snap["reason"].startswith("no snapshot")
    assert snap["dir"] == f"{bundle}.snapshot" and snap["nofile"] is not None
    assert again["snapshot"]["taken"] is False and again["snapshot"]["taken_at"] == snap["taken_at"]
    assert again["summary"]["snapshot_taken_s"] is None and again["summary"]["restore_median_ms"] > 0
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert Path(rec["chart"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_restore_phases_from_criu_log(tmp_path):
    from image.bundle.snapshot import restore_phases, snapshot_dir

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    images = snapshot_dir(bundle) / "images"
    images.mkdir(parents=True)
    assert restore_phases(bundle) == {}  # no log yet
    (images / "restore.log").write_text("(00.000000) CRIU run id = x\n(00.040000) Forking task with 1 pid\n"
                                        "(00.150000) pie: 1: `- returned 1048576\n"
                                        "(00.170000) Restore finished successfully. Tasks resumed.\n"
                                        "(00.171000) Writing stats\n")
    assert restore_phases(bundle) == {"criu_total_ms": 171.0, "criu_setup_ms": 40.0, "criu_memory_ms": 110.0,
                                      "pages_restored_bytes": 1048576, "criu_finish_ms": 20.0}
