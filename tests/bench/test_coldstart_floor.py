"""edge-coldstart's floor: a bare Python process (the runtime's interpreter and flags, numpy and
zmq, one ROUTER bound, one request answered), run alternating with the runtime in every mode.

- the floor program itself: it binds the address it is given and the benchmark's own client
  gets its reply (the cosine check included); it imports neither edge nor anything heavy;
- the record builder: ``floor_median_ms`` and ``ratio_over_floor`` in every mode's summary, null
  without floor runs, and the printout's floor line;
- the options: ``--floor-runs`` spread over the pairs, ``--no-floor``;
- real runs: ``edge-coldstart --runs 2`` in process mode, and one ``--bundle`` run under runc
  (the floor in the bundle's own image, at ``floor.sock`` in its socket directory).
Figures are not asserted beyond their sanity (they belong in docs/coldstart.md).
"""

from __future__ import annotations

import ast
import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bench.coldstart import cli
from bench.coldstart import floor_runs as F
from bench.coldstart import launch as L
from bench.coldstart import report as R
from bench.coldstart.client import Client, embed_and_check
from edge.runtime.launch import boot_env

REFERENCE = [((i * 37) % 101 - 50) / 50.0 for i in range(384)]
TEXT = "The technician checks that the appliance answers within its boot budget."


# ------------------------------------------------------------------ the floor program


def test_the_floor_imports_no_edge_and_nothing_heavy():
    tree = ast.parse(F.FLOOR_SCRIPT.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported == {"time", "os", "signal", "sys", "numpy", "zmq", "msgpack"}, imported


def test_floor_interpreter_is_the_runtimes():
    assert F.floor_interpreter() == [sys.executable, "-S"]
    assert F.floor_interpreter(["/opt/edge/python/bin/python3", "-S", "-m", "edge.boot", "--bind", "x"]) == \
        ["/opt/edge/python/bin/python3", "-S"]
    assert bytes.fromhex(F.embedding_hex([1.0, -2.5])) == b"\x00\x00\x80\x3f\x00\x00\x20\xc0"


def test_the_floor_binds_the_address_given_and_answers_the_benchmarks_client(tmp_path):
    sock_path = tmp_path / "here.sock"
    address = f"ipc://{sock_path}"
    cmd = [*F.floor_interpreter(), str(F.FLOOR_SCRIPT), "--bind", address, "--embedding-hex", F.embedding_hex(REFERENCE)]
    log = tmp_path / "floor.log"
    with open(log, "wb") as out:
        t0 = L.now_ns()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=boot_env(L.clean_env({})))
    client = Client(address)  # before the bind: the ipc connect retries, as in every run
    try:
        end, body, cos = embed_and_check(client, proc, TEXT, REFERENCE, t0 + int(60e9), log)
        assert stat.S_ISSOCK(os.stat(sock_path).st_mode)  # bound where it was told, an ipc socket file
        assert body["floor"] is True and body["address"] == address and body["pid"] == proc.pid
        assert body["count"] == 1 and body["dim"] == 384 and body["request_id"] == 1
        assert cos >= L.MIN_COSINE and end > t0
        stages = body["stages_boottime_ns"]
        assert t0 < stages["start"] <= stages["import_numpy"] <= stages["import_zmq"] <= stages["bind"] < end
        assert client.request("health", {})["live"] is True  # it serves on until stopped
    finally:
        client.close()
        proc.terminate()
        assert proc.wait(30) == 0, L.log_tail(log)  # SIGTERM: a clean exit (a handler, as PID 1 would need)
    assert not sock_path.exists()  # and its socket file is gone


def test_run_floor_is_timed_like_the_runtime(tmp_path):
    r = F.run_floor(tmp_path / "f1", TEXT, REFERENCE, timeout_s=60)
    assert r.kind == "floor" and r.total_ms > 0 and r.cosine >= L.MIN_COSINE
    assert r.reply["address"] == f"ipc://{tmp_path}/f1/floor.sock" and r.reply["floor_pid"] == r.pid
    assert list(r.phases) == ["interpreter", "import_numpy", "import_zmq", "bind", "ready_to_reply"]
    assert r.phases["ready_to_reply"][1] == pytest.approx(r.total_ms, abs=0.001)
    assert not (tmp_path / "f1" / "floor.sock").exists()  # stopped, gone


def test_a_reply_from_another_server_is_not_the_floors():
    with pytest.raises(L.RunFailed, match="not the floor's"):
        F._check_floor({"count": 1, "engine": "onnxruntime"}, "ipc:///run/edge/floor.sock")


def test_floor_bundle_replaces_only_the_process_args(tmp_path):
    bundle = tmp_path / "b"
    (bundle / "rootfs").mkdir(parents=True)
    config = {"root": {"path": "rootfs", "readonly": True},
              "process": {"args": ["/opt/edge/python/bin/python3", "-S", "-m", "edge.boot", "--engine", "onnxruntime",
                                   "--bind", "ipc:///run/edge/edge.sock"], "env": ["PYTHONPATH=/opt/edge/site"],
                          "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 65536, "soft": 65536}]},
              "mounts": [{"destination": "/run/edge", "type": "bind", "source": "/run/edge-x", "options": ["rbind"]},
                         {"destination": "/tmp/x", "type": "bind", "source": "rel/x", "options": ["rbind"]}]}
    (bundle / "config.json").write_text(json.dumps(config))
    (bundle / "edge-bundle.json").write_text(json.dumps({"address": "ipc:///run/edge-x/edge.sock",
                                                         "container_address": "ipc:///run/edge/edge.sock"}))
    fb = F.floor_bundle(bundle, tmp_path / "work", REFERENCE, nofile=20000)
    got = json.loads((fb.path / "config.json").read_text())
    assert fb.host_address == "ipc:///run/edge-x/floor.sock" and fb.container_address == "ipc:///run/edge/floor.sock"
    args = got["process"]["args"]
    assert args[:3] == ["/opt/edge/python/bin/python3", "-S", "-c"] and args[3] == F.FLOOR_SCRIPT.read_text()
    assert args[4:] == ["--bind", "ipc:///run/edge/floor.sock", "--embedding-hex", F.embedding_hex(REFERENCE)]
    assert got["process"]["env"] == config["process"]["env"] and got["root"]["readonly"] is True
    assert got["root"]["path"] == str(bundle.resolve() / "rootfs")
    assert got["mounts"][0]["source"] == "/run/edge-x" and got["mounts"][1]["source"] == str(bundle.resolve() / "rel/x")
    assert got["process"]["rlimits"][0]["hard"] == 20000
    assert json.loads((bundle / "config.json").read_text()) == config  # the bundle itself untouched
    (bundle / "edge-bundle.json").write_text(json.dumps({"address": "tcp://127.0.0.1:5555"}))
    with pytest.raises(L.RunFailed, match="ipc"):
        F.floor_bundle(bundle, tmp_path / "work2", REFERENCE)


# ------------------------------------------------------------------ the record and the options


def _pairs(runtime: list[float], floor: list[float | None], fresh: list[float] | None = None) -> list[dict]:
    pairs = []
    for i, (t, f) in enumerate(zip(runtime, floor), 1):
        p = {"i": i, "runtime": {"total_ms": t, "phases": {}, "timeline": None}}
        if f is not None:
            p["floor"] = {"kind": "floor", "total_ms": f, "phases": {"interpreter": [0.0, 10.0]}}
        if fresh:
            p["fresh"] = {"total_ms": fresh[i - 1], "phases": {}, "timeline": None}
        pairs.append(p)
    return pairs


@pytest.mark.parametrize("mode", ["process", "bundle", "snapshot", "unit"])
def test_the_summary_carries_the_floor_in_every_mode(mode):
    pairs = _pairs([400.0, 500.0, 450.0], [200.0, 180.0, None], fresh=[600.0, 640.0, 620.0] if mode == "snapshot" else None)
    s = R.summarize(pairs, "onnxruntime", 1500.0, 0)
    if mode == "snapshot":
        s.update(R.snapshot_summary(pairs, None))
    s.update(F.floor_summary(pairs, s["median_ms"], s.get("fresh_median_ms") if mode == "snapshot" else None))
    assert s["floor_median_ms"] == 190.0 and s["floor_runs"] == 2 and s["floor_min_ms"] == 180.0
    assert s["ratio_over_floor"] == round(450.0 / 190.0, 2)
    assert ("fresh_ratio_over_floor" in s) is (mode == "snapshot")
    if mode == "snapshot":
        assert s["fresh_ratio_over_floor"] == round(620.0 / 190.0, 2)
    none = F.floor_summary(_pairs([400.0], [None]), 400.0)
    assert none["floor_median_ms"] is None and none["ratio_over_floor"] is None and none["floor_runs"] == 0


def test_the_printout_shows_the_floor():
    pairs = _pairs([400.0, 500.0], [200.0, 220.0])
    rec = {"config": {"mode": "process", "engine": "onnxruntime", "cache": "warm", "snapshot": False},
           "phases": {"runtime": R.phase_table([p["runtime"] for p in pairs]),
                      "floor": R.phase_table([p["floor"] for p in pairs])}, "runs": pairs}
    rec["summary"] = R.summarize(pairs, "onnxruntime", 1500.0, 0)
    rec["summary"].update(F.floor_summary(pairs, rec["summary"]["median_ms"]))
    out = R.format_table(rec)
    assert R.FLOOR_TITLE in out and "floor: median 210 ms" in out and "= 2.14x" in out
    rec["summary"].update(F.floor_summary([], rec["summary"]["median_ms"]))
    rec["config"]["floor"] = {"note": "--no-floor"}
    assert "floor: not measured (--no-floor)" in R.format_table(rec)


@pytest.mark.parametrize("argv, runs, due", [
    ([], 10, [True] * 10),
    (["--floor-runs", "5"], 10, [False, True] * 5),
    (["--floor-runs", "3", "--runs", "4"], 4, [False, True, True, True]),
    (["--no-floor"], 10, [False] * 10),
])
def test_floor_runs_alternate_with_the_runtimes(argv, runs, due):
    args = cli.parse_args(argv + ([] if "--runs" in argv else ["--runs", str(runs)]))
    bench = cli.Bench.__new__(cli.Bench)
    bench.args = args
    assert [bench._floor_due(i) for i in range(1, runs + 1)] == due
    assert sum(due) == args.floor_runs


def test_floor_options_are_checked():
    with pytest.raises(SystemExit):
        cli.parse_args(["--runs", "2", "--floor-runs", "3"])
    with pytest.raises(SystemExit):
        cli.parse_args(["--no-floor", "--floor-runs", "2"])
    assert cli.parse_args(["--no-floor"]).floor_runs == 0


# ------------------------------------------------------------------ real runs


@pytest.fixture(scope="module")
def process_run(minilm_package, tmp_path_factory):
    out = tmp_path_factory.mktemp("coldstart-floor")
    cmd = [sys.executable, "-m", "bench.coldstart.cli", "--runs", "2", "--no-baseline", "--package", str(minilm_package),
           "--budget-ms", "1e9", "--json", str(out / "record.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, json.loads((out / "record.json").read_text())


def _check_floor_record(rec: dict, how: str) -> None:
    s = rec["summary"]
    assert s["floor_median_ms"] > 0 and s["floor_runs"] == 2 and s["failed_runs"] == 0
    assert s["ratio_over_floor"] == pytest.approx(s["median_ms"] / s["floor_median_ms"], abs=0.006)
    assert rec["config"]["floor"]["how"] == how and rec["config"]["floor"]["runs"] == 2
    floors = [p["floor"] for p in rec["runs"]]
    assert len(floors) == 2 and all(f["kind"] == "floor" and f["cosine"] >= L.MIN_COSINE for f in floors)
    assert all(f["reply"]["floor"] is True and f["reply"]["address"].endswith("/floor.sock") for f in floors)
    assert "floor" in rec["phases"] and "import_numpy" in rec["phases"]["floor"]


def test_real_process_run_has_the_floor(process_run):
    proc, rec = process_run
    _check_floor_record(rec, "process")
    assert rec["config"]["floor"]["argv"][:3] == [sys.executable, "-S", str(F.FLOOR_SCRIPT)]
    assert "floor 0" not in proc.stderr and "| floor " in proc.stderr  # each pair's progress line names it
    assert f"floor: median {rec['summary']['floor_median_ms']:.0f} ms" in proc.stdout


def test_real_bundle_run_has_the_floor_in_the_bundles_image(ort_bundle):
    from support.bundles import private_bundle, runc_or_skip

    runc_or_skip()
    work = Path(tempfile.mkdtemp(prefix="edge-cs-floor-", dir="/tmp"))  # a socket path short enough
    try:
        bundle = private_bundle(ort_bundle, work)
        meta = json.loads((bundle / "config.json").read_text())
        before = json.dumps(meta)
        out = work / "record.json"
        cmd = [sys.executable, "-m", "bench.coldstart.cli", "--bundle", str(bundle), "--runs", "2", "--no-baseline",
               "--budget-ms", "1e9", "--json", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=work)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        rec = json.loads(out.read_text())
        _check_floor_record(rec, "runc")
        fl = rec["config"]["floor"]
        assert fl["address"] == f"ipc://{work}/run/floor.sock" and fl["argv"][-1] == "ipc:///run/edge/floor.sock"
        assert fl["argv"][0] == json.loads(before)["process"]["args"][0]  # the bundle's own interpreter
        assert (bundle / "config.json").read_text() == before  # the bundle is never modified
        assert not (work / "run" / "floor.sock").exists()
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)


def test_no_floor_leaves_the_fields_null(tmp_path):
    """--no-floor: no floor run, the fields still there (null), the printout says why."""
    args = cli.parse_args(["--no-floor", "--runs", "1", "--json", str(tmp_path / "r.json")])
    bench = cli.Bench(args)
    try:
        bench._floor_setup()
        assert bench.floor_info == {"runs": 0, "how": None, "note": "--no-floor"}
    finally:
        bench.close()
