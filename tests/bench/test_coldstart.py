"""edge-coldstart, the tool itself: verdict and statistics, the cache helpers, and one short real run.

The real run (N=2, warm cache, baseline included) starts the runtime as a process against
the real MiniLM package and checks the record's fields and the exit status; figures are
not asserted (they belong in the benchmark note).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from bench.coldstart import cache as C
from bench.coldstart import cli
from bench.coldstart import launch as L
from bench.coldstart import report as R

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ verdict and statistics


@pytest.mark.parametrize("median, budget, failed, ok", [
    (400.0, 1500.0, 0, True),
    (1500.0, 1500.0, 0, True),  # at the budget is within it
    (1500.1, 1500.0, 0, False),
    (400.0, 1500.0, 1, False),  # a run without a correct reply fails whatever the median
    (None, 1500.0, 0, False),
])
def test_verdict(median, budget, failed, ok):
    passed, line = R.verdict(median, budget, failed)
    assert passed is ok
    assert line.startswith("PASS" if ok else "FAIL")
    assert f"{budget:.0f} ms" in line


def test_stats_match_numpy_percentiles():
    np = pytest.importorskip("numpy")
    vals = [512.0, 480.0, 455.5, 610.0, 499.0, 470.25, 530.0, 1200.0, 462.0, 488.0]
    s = R.stats(vals)
    assert s["n"] == 10 and s["min"] == 455.5 and s["max"] == 1200.0
    assert s["median"] == round(float(np.median(vals)), 1)
    assert s["p95"] == round(float(np.percentile(vals, 95)), 1)
    assert R.stats([])["median"] is None


def _fake_runtime_run(total: float, import_end: float, engine_import: float, ready: float) -> dict:
    stages = [
        {"stage": "interpreter", "start_ms": 0.0, "end_ms": 30.0},
        {"stage": "import_tokenizer", "start_ms": 40.0, "end_ms": import_end},
        {"stage": "verify_package", "start_ms": import_end, "end_ms": ready - 5, "overlapped": True},
        {"stage": "import_engine", "start_ms": import_end + 1, "end_ms": import_end + 1 + engine_import},
    ]
    phases = {s["stage"]: [s["start_ms"], s["end_ms"]] for s in stages}
    phases["boot_imports"] = [30.0, 40.0]
    phases["ready_to_reply"] = [ready, total]
    return {"total_ms": total, "phases": phases, "timeline": {"stages": stages, "exec_to_ready_ms": ready}}


def test_phase_durations_and_own_stages():
    run = _fake_runtime_run(total=500.0, import_end=200.0, engine_import=50.0, ready=480.0)
    d = R.phase_durations(run)
    assert d["interpreter"] == 30.0 and d["boot_imports"] == 10.0 and d["import_tokenizer"] == 160.0
    assert d["ready_to_reply"] == 20.0 and d["exec_to_ready"] == 480.0 and d["total"] == 500.0
    # the sum of every stage but interpreter start-up and imports: verify_package and ready_to_reply here
    assert d["own_stages"] == (480.0 - 5 - 200.0) + 20.0
    table = R.phase_table([run, _fake_runtime_run(700.0, 300.0, 60.0, 650.0)])
    assert list(table)[-3:] == ["own_stages", "exec_to_ready", "total"]
    assert table["total"]["median"] == 600.0


def test_summary_ratio_goals_and_compare():
    pairs = [{"i": i, "runtime": _fake_runtime_run(t, 200.0, 50.0, t - 20), "baseline": {"total_ms": b}, "ratio": b / t}
             for i, (t, b) in enumerate([(400.0, 4000.0), (500.0, 3000.0), (450.0, 4500.0)], 1)]
    s = R.summarize(pairs, "onnxruntime", 1500.0, 0)
    for key in ("median_ms", "p95_ms", "baseline_median_ms", "ratio_median", "budget_ms", "pass"):
        assert key in s
    assert s["median_ms"] == 450.0 and s["baseline_median_ms"] == 4000.0
    assert s["ratio_median"] == 10.0  # per pair 10, 6, 10
    assert s["pass"] is True
    assert s["goals"] == {"exec_to_reply_le_ms": 500.0, "exec_to_reply_met": True, "ratio_ge": 8.0, "ratio_met": True}
    assert R.summarize(pairs, "onnxruntime", 449.0, 0)["pass"] is False
    ts = R.summarize([{**p, "import_torch": {"total_ms": 100.0}} for p in pairs], "torchscript", 1500.0, 0)
    assert ts["goals"]["exec_to_reply_le_ms"] == 500.0 and ts["goals"]["exec_to_reply_met"] is True
    # the time goals are warm-cache goals: a cold run is judged against a warm record instead
    assert "exec_to_reply_le_ms" not in R.summarize(pairs, "onnxruntime", 1500.0, 0, cache="cold")["goals"]

    warm = {"config": {"cache": "warm"}, "phases": {"runtime": R.phase_table([p["runtime"] for p in pairs])}}
    cold_pairs = [{**p, "runtime": _fake_runtime_run(p["runtime"]["total_ms"] * 2, 200.0, 50.0, 100.0)} for p in pairs]
    cold = {"phases": {"runtime": R.phase_table([p["runtime"] for p in cold_pairs])}}
    c = R.compare(cold, warm)
    assert c["median_ratio"]["total"] == 2.0
    assert c["own_stages_ratio"] > 2.0 and c["own_stages_within_goal"] is False


# ------------------------------------------------------------------ client helpers and cache


def test_cosine_and_decode():
    a = L.decode_f32le(struct.pack("<3f", 1.0, 2.0, 3.0))
    assert list(a) == [1.0, 2.0, 3.0]
    assert L.cosine(a, [2.0, 4.0, 6.0]) == pytest.approx(1.0)
    assert L.cosine(a, [-1.0, -2.0, -3.0]) == pytest.approx(-1.0)
    assert L.cosine(a, [0.0, 0.0, 0.0]) == 0.0


def test_eviction_set_dedups_and_keeps_regular_files(tmp_path):
    f = REPO / "bench" / "coldstart" / "cache.py"
    s = C.EvictionSet()
    s.add("a", [str(f), str(f), str(REPO / "bench"), "/proc/self/maps", "/no/such/file"])
    s.add("b", [str(f)])
    assert list(s.files) == [str(f.resolve())]
    assert s.summary()["sources"] == {"a": 1, "b": 0}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="posix_fadvise/mincore are Linux")
def test_evict_drops_a_cached_file():
    # Under the repo (a disk filesystem; tmpfs pages cannot be dropped), never mapped by anyone.
    path = REPO / ".cache" / f"coldstart-evict-{os.getpid()}.bin"
    path.parent.mkdir(exist_ok=True)
    try:
        path.write_bytes(os.urandom(4 << 20))
        os.sync()  # dirty pages are not dropped; written back they are
        path.read_bytes()
        assert C.resident_bytes([str(path)]) > (2 << 20)
        ev = C.evict([str(path)])
        assert ev["files"] == 1 and ev["errors"] == 0 and ev["bytes"] == 4 << 20
        assert C.resident_bytes([str(path)]) < (1 << 20)
    finally:
        path.unlink(missing_ok=True)


def test_chart_is_skipped_with_a_note_without_matplotlib(monkeypatch, tmp_path):
    from bench.coldstart import chart

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    note = chart.write_chart({"runs": [], "config": {}, "summary": {}}, tmp_path / "x.png")
    assert note and "matplotlib" in note
    assert not (tmp_path / "x.png").exists()


# ------------------------------------------------------------------ one short real run


@pytest.fixture(scope="module")
def real_run(minilm_package, tmp_path_factory):
    out = tmp_path_factory.mktemp("coldstart")
    cmd = [sys.executable, "-m", "bench.coldstart.cli", "--runs", "2", "--package", str(minilm_package),
           "--budget-ms", "1e9", "--json", str(out / "record.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=out)
    return proc, out


def test_real_run_passes_a_huge_budget(real_run):
    proc, out = real_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[1/2]" in proc.stderr and "[2/2]" in proc.stderr  # progress
    assert proc.stdout.strip().splitlines()[-1].startswith("PASS")
    assert "TOTAL exec -> first reply" in proc.stdout and "import_tokenizer" in proc.stdout


def test_real_run_record(real_run):
    _, out = real_run
    rec = json.loads((out / "record.json").read_text())
    s = rec["summary"]
    for key in ("median_ms", "p95_ms", "baseline_median_ms", "ratio_median", "budget_ms", "pass"):
        assert s[key] is not None, key
    assert s["pass"] is True and s["budget_ms"] == 1e9 and s["failed_runs"] == 0
    assert s["baseline_median_ms"] > 0 and len(s["ratios"]) == 2
    assert rec["config"]["engine"] == "onnxruntime" and rec["config"]["cache"] == "warm" and rec["config"]["runs"] == 2
    m = rec["machine"]
    for key in ("cpu", "memory_bytes", "kernel", "jetson_model", "l4t_release", "nvpmodel"):
        assert key in m
    assert m["memory_bytes"] > 0 and m["kernel"]
    pkg = rec["package"]
    assert set(pkg["files"]) >= {"model.ort", "tokenizer.fb"} and len(pkg["manifest_sha256"]) == 64
    assert pkg["lineage"]["package_sha256"] and pkg["lineage"]["engine"] == "onnxruntime"
    assert len(rec["runs"]) == 2
    for pair in rec["runs"]:
        rt, base = pair["runtime"], pair["baseline"]
        assert rt["cosine"] >= L.MIN_COSINE and base["cosine"] >= L.MIN_COSINE
        stages = [st["stage"] for st in rt["timeline"]["stages"]]
        assert stages[0] == "interpreter" and {"import_tokenizer", "warm_buckets"} <= set(stages)
        # One clock: the runtime's READY lies between its exec and our reply.
        assert 0 < rt["timeline"]["exec_to_ready_ms"] <= rt["total_ms"]
        assert pair["ratio"] == pytest.approx(base["total_ms"] / rt["total_ms"])
    assert "total" in rec["phases"]["runtime"] and "import_sentence_transformers" in rec["phases"]["baseline"]


def test_real_run_chart(real_run):
    _, out = real_run
    rec = json.loads((out / "record.json").read_text())
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert rec["chart"] is None and "matplotlib" in rec["chart_note"]
        return
    png = Path(rec["chart"])
    assert png == out / "record.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_real_record_over_a_tiny_budget_exits_1(real_run, tmp_path, capsys):
    _, out = real_run
    rec = json.loads((out / "record.json").read_text())
    args = cli.parse_args(["--budget-ms", "1", "--json", str(tmp_path / "tiny.json")])
    rec["summary"] = R.summarize(rec["runs"], rec["config"]["engine"], args.budget_ms, len(rec["failures"]))
    assert cli.emit(rec, args) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("FAIL")
    assert json.loads((tmp_path / "tiny.json").read_text())["summary"]["pass"] is False


def test_real_cold_run_evicts_the_traced_files(minilm_package, tmp_path):
    """--cache cold: the burn-in traces a boot (as the device starts it) and every run evicts what it read."""
    cmd = [sys.executable, "-m", "bench.coldstart.cli", "--runs", "1", "--cache", "cold", "--no-baseline",
           "--package", str(minilm_package), "--budget-ms", "1e9", "--json", str(tmp_path / "cold.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = json.loads((tmp_path / "cold.json").read_text())
    evict = rec["cache"]["eviction_set"]
    assert rec["config"]["cache"] == "cold" and rec["summary"]["failed_runs"] == 0
    # the runtime's traced files (edge's own modules among them) and the package are in the set
    assert evict["files"] > 100 and rec["cache"]["runtime_files_check"]["files"] > 0
    assert "byte-compiled" in rec["cache"]["bytecode"]


def test_relative_paths_are_made_absolute_before_the_runs(tmp_path, monkeypatch):
    """The runtime runs in a work directory of its own: a relative --package must still name the package."""
    from bench.coldstart.args import check_paths

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "manifest.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    args = cli.parse_args(["--package", "pkg", "--json", str(tmp_path / "r.json")])
    check_paths(args)
    assert args.package == pkg and args.package.is_absolute()
