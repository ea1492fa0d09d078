"""``edge selftest``'s checks against an in-process server with the fake engine, and the
manifest's ``selftest`` section (the real runtime: tests/integration/test_selftest_gate.py)."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest

from edge import cli
from edge.commands import selftest as S
from edge.errors import ErrorCode, PackageError
from edge.ipc.protocol import Lineage
from edge.ipc.server import IpcServer
from edge.preload.manifest import (DEFAULT_BOOT_BUDGET_MS, SELFTEST_MIN_COSINE, manifest_digest, model_digest,
                                   open_package)
from edge.serving.core import ServingCore
from support.ipc_fakes import DIM, VOCAB, FakeEngine, FakeTokenizer, expected_embedding

TEXT = "the quick brown fox checks its health"
REFERENCE = expected_embedding(FakeTokenizer().encode(TEXT).ids)  # (DIM,): what the fake server answers
SERVING = {"buckets": [8, 16, 32, 64], "max_batch_size": 8, "max_batch_tokens": 256, "max_delay_ms": 2.0,
           "max_queue_requests": 64, "max_queue_tokens": 4096}
TIMELINE = {"stages": [], "exec_to_ready_ms": 420.0, "pid": 4242, "start": "fresh"}


def reference(embedding=REFERENCE, **kw) -> dict:
    return {"text": TEXT, "embedding": [float(x) for x in embedding], "min_cosine": SELFTEST_MIN_COSINE,
            "boot_budget_ms": DEFAULT_BOOT_BUDGET_MS, "computed_with": {"engine": "fake", "device": "cpu"}, **kw}


def write_package(root: Path, selftest: dict | None = None, **fields) -> str:
    """A package directory whose manifest is valid and lists no files; its package_sha256."""
    data = {"format_version": 1, "name": "fake", "model_sha256": model_digest({}), "tokenizer_sha256": None,
            "files": {}, "inputs": [], "outputs": [], "output_dim": DIM, "max_seq_length": 64, "pooling": "mean",
            "normalize": True, "vocab_size": VOCAB, "engines": {}, "serving": {}, "source": {},
            "tool_versions": {}, **fields}
    if selftest is not None:
        data["selftest"] = selftest
    data["package_sha256"] = manifest_digest(data)
    root.mkdir(parents=True, exist_ok=True)
    (root / "manifest.json").write_text(json.dumps(data))
    return data["package_sha256"]


@pytest.fixture
def work():
    d = Path(tempfile.mkdtemp(prefix="edge-st-", dir="/tmp"))  # short: an AF_UNIX path holds 107 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def serve(work):
    """serve(package_sha256, timeline=..., ready=True, start=True): a fake-engine server at work/run/edge.sock."""
    servers: list[IpcServer] = []

    def make(package_sha256: str, timeline=TIMELINE, ready: bool = True, start: bool = True) -> IpcServer:
        engine = FakeEngine()
        core = ServingCore(engine, FakeTokenizer(), dict(SERVING), max_seq_length=64)
        lineage = Lineage(model="fake", model_sha256="m" * 64, tokenizer_sha256="t" * 64,
                          package_sha256=package_sha256, engine=engine.name, device=engine.device)
        server = IpcServer(f"ipc://{work}/run/edge.sock", core, lineage,
                           timeline=None if timeline is None else (lambda: dict(timeline)))
        servers.append(server)
        if start:
            server.bind()
            server.start(ready=ready)
        return server

    yield make
    for s in servers:
        s.request_drain()
        assert s.wait(20.0), "server did not stop within 20 s"


def selftest(capsys, *argv) -> tuple[int, dict, str]:
    rc = cli.main(["selftest", "--json", *argv])
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["exit_status"] == rc
    return rc, report, err


def checks(report: dict) -> dict[str, dict]:
    assert [c["name"] for c in report["checks"]] == list(S.CHECKS)
    return {c["name"]: c for c in report["checks"]}


# ------------------------------------------------------------------ all pass


def test_all_checks_pass(serve, work, capsys):
    digest = write_package(work / "pkg", reference())
    server = serve(digest)
    rc, report, err = selftest(capsys, "--connect", server.address, "--package", str(work / "pkg"))
    assert rc == 0 and report["passed"] is True and report["failed"] == [] and err == ""
    c = checks(report)
    assert all(x["passed"] is True for x in c.values())
    assert c["package"]["measured"]["package_sha256"] == digest == c["package"]["measured"]["served_package_sha256"]
    assert c["reference"]["measured"]["cosine"] == pytest.approx(1.0, abs=1e-6)
    assert c["reference"]["measured"]["engine"] == "fake" and c["reference"]["measured"]["dim"] == DIM
    budget = c["boot_budget"]["measured"]  # the contract's fields, then what says which start was judged and how
    assert {k: budget[k] for k in ("exec_to_ready_ms", "budget_ms", "budget_source", "start", "pid")} == {
        "exec_to_ready_ms": 420.0, "budget_ms": DEFAULT_BOOT_BUDGET_MS, "budget_source": "the package's",
        "start": "fresh", "pid": 4242}
    assert budget["judged"] == "fresh" and budget["snapshot_possible"] is False and budget["engine"] == "fake"
    assert budget["fresh_boot_budget_ms"] == budget["boot_budget_ms"] == DEFAULT_BOOT_BUDGET_MS  # none in the package
    assert report["package_source"] == "--package"


def test_human_lines_name_each_check(serve, work, capsys):
    server = serve(write_package(work / "pkg", reference()))
    assert cli.main(["selftest", "--connect", server.address, "--package", str(work / "pkg")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines[:4]] == [["PASS", n] for n in S.CHECKS]
    assert lines[2].split(None, 2)[2].startswith("cosine 1.0000000 >= 0.9999")
    assert "exec to ready 420 ms within the package's budget of 1500 ms (a fresh start where no snapshot" in lines[3]
    assert lines[3].endswith("the package names no fresh-start budget for fake)")
    assert lines[-1].startswith("edge selftest: PASS")


def test_waits_for_the_server_to_come_up(serve, work, capsys):
    server = serve(write_package(work / "pkg", reference()), start=False)
    timer = threading.Timer(0.4, lambda: (server.bind(), server.start()))  # no socket file until then
    timer.start()
    try:
        rc, report, _ = selftest(capsys, "--connect", server.address, "--package", str(work / "pkg"),
                                 "--timeout", "10")
    finally:
        timer.join()
    assert rc == 0 and checks(report)["ready"]["measured"]["waited_ms"] >= 300


# ------------------------------------------------------------------ ready


def test_alive_but_not_ready_fails_ready(serve, work, capsys):
    server = serve(write_package(work / "pkg", reference()), ready=False)
    rc, report, err = selftest(capsys, "--connect", server.address, "--package", str(work / "pkg"),
                               "--timeout", "0.4")
    c = checks(report)
    assert rc == 1 and c["ready"]["passed"] is False and "answered but was not ready" in c["ready"]["detail"]
    assert c["ready"]["measured"]["state"] == "booting"
    assert [c[n]["passed"] for n in ("package", "reference", "boot_budget")] == [None, None, None]
    assert report["failed"] == ["ready"] and report["not_run"] == ["package", "reference", "boot_budget"]
    assert err.startswith("edge selftest: FAIL (ready; not run: package, reference, boot_budget): ready: ")


def test_no_server_is_exit_2(work, capsys):
    write_package(work / "pkg", reference())
    rc, report, _ = selftest(capsys, "--connect", f"ipc://{work}/absent.sock", "--package", str(work / "pkg"),
                             "--timeout", "0.3")
    c = checks(report)
    assert rc == 2 and c["ready"]["passed"] is False
    assert "no server answered" in c["ready"]["detail"] and "socket file does not exist" in c["ready"]["detail"]


def test_usage_errors_are_exit_2(capsys):
    assert cli.main(["selftest", "--connect", "ftp://x"]) == 2
    assert "edge selftest: --connect" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        cli.main(["selftest", "--budget-ms", "0"])
    assert info.value.code == 2


# ------------------------------------------------------------------ package


def test_wrong_package_fails_and_skips_the_reference(serve, work, capsys):
    write_package(work / "pkg", reference())
    server = serve("f" * 64)
    rc, report, _ = selftest(capsys, "--connect", server.address, "--package", str(work / "pkg"))
    c = checks(report)
    assert rc == 1 and c["package"]["passed"] is False
    assert c["package"]["detail"].startswith("wrong package: the server runs package_sha256 ffffffffffffffff...")
    assert c["reference"]["passed"] is None
    # the boot is still measured, against the default budget (the served package's is unknown)
    assert c["boot_budget"]["passed"] is True and c["boot_budget"]["measured"]["budget_source"] == "the default"


def test_unreadable_package_fails(serve, work, capsys):
    server = serve("f" * 64)
    rc, report, _ = selftest(capsys, "--connect", server.address, "--package", str(work / "absent"))
    c = checks(report)
    assert rc == 1 and c["package"]["passed"] is False and "cannot read the package" in c["package"]["detail"]


def test_package_comes_from_edge_package_then_the_device(serve, work, capsys, monkeypatch):
    server = serve(write_package(work / "pkg", reference()))
    monkeypatch.setenv("EDGE_PACKAGE", str(work / "pkg"))
    rc, report, _ = selftest(capsys, "--connect", server.address)
    assert rc == 0 and report["package_source"] == "EDGE_PACKAGE" and report["package"] == str(work / "pkg")
    monkeypatch.delenv("EDGE_PACKAGE")
    monkeypatch.setattr(S, "DEVICE_PACKAGE", str(work / "pkg"))
    assert S.find_package(None, env={}) == (str(work / "pkg"), "the device's bundle")
    monkeypatch.setattr(S, "DEVICE_PACKAGE", str(work / "absent"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(work / "cache"))
    found, source = S.find_package(None, env={})
    assert found is None and source.startswith(f"none found: not {work / 'absent'}, nor {work / 'cache'}")


# ------------------------------------------------------------------ reference


def _at_cosine(cos: float) -> np.ndarray:
    """A unit vector whose cosine with REFERENCE is exactly ``cos``."""
    other = np.roll(REFERENCE, 1).astype(np.float64)
    other -= (other @ REFERENCE) * REFERENCE  # orthogonal to REFERENCE
    other /= np.linalg.norm(other)
    return cos * REFERENCE.astype(np.float64) + np.sqrt(1 - cos**2) * other


@pytest.mark.parametrize("cos,passed", [(0.99995, True), (0.99985, False), (0.5, False)])
def test_reference_cosine_threshold(serve, work, capsys, cos, passed):
    server = serve(write_package(work / "pkg", reference(_at_cosine(cos))))
    rc, report, _ = selftest(capsys, "--connect", server.address, "--package", str(work / "pkg"))
    c = checks(report)["reference"]
    assert rc == (0 if passed else 1) and c["passed"] is passed
    assert c["measured"]["cosine"] == pytest.approx(cos, abs=2e-6) and c["measured"]["min_cosine"] == 0.9999
    if not passed:
        assert c["detail"].startswith(f"cosine {c['measured']['cosine']:.7f} < 0.9999")


def test_the_package_sets_the_threshold(serve, work, capsys):
    server = serve(write_package(work / "pkg", reference(_at_cosine(0.99), min_cosine=0.98)))
    rc, report, _ = selftest(capsys, "--connect", server.address, "--package", str(work / "pkg"))
    assert rc == 0 and checks(report)["reference"]["measured"]["min_cosine"] == 0.98


def test_package_without_reference_fails_unless_allowed(serve, work, capsys):
    server = serve(write_package(work / "pkg"))  # built before the reference existed
    rc, report, _ = selftest(capsys, "--connect", server.address, "--package", str(work / "pkg"))
    c = checks(report)
    assert rc == 1 and c["reference"]["passed"] is False and c["reference"]["measured"] == {"available": False}
    assert c["reference"]["detail"].startswith("not available in this package")
    assert c["boot_budget"]["passed"] is True and c["boot_budget"]["measured"]["budget_source"] == "the default"
    rc, report, _ = selftest(capsys, "--connect", server.address, "--package", str(work / "pkg"),
                             "--allow-missing-reference")
    assert rc == 0 and "--allow-missing-reference" in checks(report)["reference"]["detail"]


# ------------------------------------------------------------------ boot budget


@pytest.mark.parametrize("ready_ms,package_budget,flag,passed,source", [
    (1499.0, 1500.0, None, True, "the package's"),
    (1501.0, 1500.0, None, False, "the package's"),
    (2000.0, 2500.0, None, True, "the package's"),
    (2000.0, 1500.0, "2500", True, "--budget-ms"),
    (400.0, 1500.0, "300", False, "--budget-ms"),
])
def test_boot_budget(serve, work, capsys, ready_ms, package_budget, flag, passed, source):
    server = serve(write_package(work / "pkg", reference(boot_budget_ms=package_budget)),
                   timeline={**TIMELINE, "exec_to_ready_ms": ready_ms})
    rc, report, _ = selftest(capsys, "--connect", server.address, "--package", str(work / "pkg"),
                             *(["--budget-ms", flag] if flag else []))
    c = checks(report)["boot_budget"]
    assert rc == (0 if passed else 1) and c["passed"] is passed
    assert c["measured"]["budget_source"] == source and c["measured"]["exec_to_ready_ms"] == ready_ms
    assert (" over " in c["detail"]) is not passed


FRESH = {"fake": 9000.0}  # the package's fresh_boot_budget_ms


def fresh_package(work: Path, **kw) -> str:
    return write_package(work / "pkg", reference(fresh_boot_budget_ms=FRESH, **kw), engines={"fake": {"files": []}})


def start_record(work: Path, address: str, **fields) -> str:
    """edge-supervise's start.json (edge/supervise/start_record.py) for the server at ``address``."""
    path = work / "start.json"
    path.write_text(json.dumps({"format": 1, "pid": 1, "boottime_ns": {}, "address": address, **fields}))
    return str(path)


@pytest.mark.parametrize("start,ready_ms,flags,passed,budget,judged_by", [
    # restored: the package's budget, whatever the fresh one
    ("restored", 1400.0, [], True, 1500.0, "boot_budget_ms"),
    ("restored", 1600.0, [], False, 1500.0, "boot_budget_ms"),
    # fresh, no snapshot can be taken (no start record: a server started by hand): the engine's fresh budget
    ("fresh", 8000.0, [], True, 9000.0, "fresh_boot_budget_ms"),
    ("fresh", 9100.0, [], False, 9000.0, "fresh_boot_budget_ms"),
    ("fresh", 8000.0, ["--snapshots", "no"], True, 9000.0, "fresh_boot_budget_ms"),
    ("fresh", 8000.0, ["--fresh-budget-ms", "7000"], False, 7000.0, "fresh_boot_budget_ms"),
    # fresh where a snapshot can be taken: this start should have been restored
    ("fresh", 8000.0, ["--snapshots", "yes"], False, 1500.0, "boot_budget_ms"),
    # --budget-ms holds whichever start is judged
    ("fresh", 8000.0, ["--budget-ms", "8500"], True, 8500.0, "--budget-ms"),
    ("restored", 300.0, ["--budget-ms", "200"], False, 200.0, "--budget-ms"),
])
def test_which_start_is_judged_and_against_which_budget(serve, work, capsys, start, ready_ms, flags, passed, budget,
                                                         judged_by):
    server = serve(fresh_package(work), timeline={**TIMELINE, "start": start, "exec_to_ready_ms": ready_ms})
    rc, report, _ = selftest(capsys, "--connect", server.address, "--package", str(work / "pkg"),
                             "--start-record", str(work / "none.json"), *flags)
    c = checks(report)["boot_budget"]
    assert (rc, c["passed"]) == ((0, True) if passed else (1, False)), c
    m = c["measured"]
    assert m["budget_ms"] == budget and m["budget"] == judged_by and m["judged"] == start
    assert m["boot_budget_ms"] == 1500.0 and m["fresh_boot_budget_ms"] == (7000.0 if "--fresh-budget-ms" in flags
                                                                            else 9000.0)
    assert (" over " in c["detail"]) is not passed and f"of {budget:.0f} ms" in c["detail"]
    assert c["detail"].startswith("exec to ready" if start == "fresh" else "restored start to ready")
    if start == "fresh" and judged_by == "fresh_boot_budget_ms":
        assert "fresh-start budget" in c["detail"] and "no snapshot can be taken" in c["detail"]
        assert m["snapshot_possible"] is False


@pytest.mark.parametrize("record,possible,says", [
    ({"start": "restored", "snapshot": "none"}, True, "restored this start"),
    ({"start": "fresh", "snapshot": "taking"}, True, "is taking one"),
    ({"start": "fresh", "snapshot": "taken", "not_restored": "no snapshot in /x"}, True, "not restored: no snapshot"),
    ({"start": "fresh", "snapshot": "off"}, False, "--snapshot off"),
    ({"start": "fresh", "snapshot": "failed", "snapshot_error": "no criu on PATH"}, False, "no criu on PATH"),
])
def test_the_supervisors_start_record_says_whether_a_snapshot_can_be_taken(serve, work, capsys, record, possible,
                                                                            says):
    server = serve(fresh_package(work), timeline={**TIMELINE, "exec_to_ready_ms": 3000.0})
    rc, report, _ = selftest(capsys, "--connect", server.address, "--package", str(work / "pkg"),
                             "--start-record", start_record(work, server.address, **record))
    c = checks(report)["boot_budget"]
    assert c["measured"]["snapshot_possible"] is possible and says in c["measured"]["snapshot_why"]
    # a fresh 3 s boot: over the restored budget where a snapshot can be taken, within the fresh one where not
    assert c["passed"] is (not possible) and c["measured"]["budget_ms"] == (1500.0 if possible else 9000.0)
    other = start_record(work, "ipc:///elsewhere.sock", start="restored")  # another server's: says nothing of this one
    rc, report, _ = selftest(capsys, "--connect", server.address, "--package", str(work / "pkg"),
                             "--start-record", other)
    assert checks(report)["boot_budget"]["measured"]["snapshot_possible"] is False


def test_fresh_budget_of_another_engine_or_an_older_package(serve, work, capsys):
    """A package that names no fresh budget for the served engine holds a fresh start to its boot budget."""
    server = serve(write_package(work / "pkg", reference(fresh_boot_budget_ms={"other": 9000.0}),
                                 engines={"fake": {"files": []}, "other": {"files": []}}),
                   timeline={**TIMELINE, "exec_to_ready_ms": 2000.0})
    rc, report, _ = selftest(capsys, "--connect", server.address, "--package", str(work / "pkg"),
                             "--start-record", str(work / "none.json"))
    c = checks(report)["boot_budget"]
    assert rc == 1 and c["measured"]["fresh_boot_budget_ms"] == 1500.0 and c["measured"]["budget_ms"] == 1500.0


def test_restored_start_and_missing_timeline(serve, work, capsys):
    digest = write_package(work / "pkg", reference())
    server = serve(digest, timeline={**TIMELINE, "start": "restored", "exec_to_ready_ms": 250.0})
    rc, report, _ = selftest(capsys, "--connect", server.address, "--package", str(work / "pkg"))
    assert rc == 0 and checks(report)["boot_budget"]["detail"].startswith("restored start to ready 250 ms within")
    server.request_drain()
    assert server.wait(20.0)
    server = serve(digest, timeline=None)  # a server that keeps no timeline
    rc, report, _ = selftest(capsys, "--connect", server.address, "--package", str(work / "pkg"))
    c = checks(report)["boot_budget"]
    assert rc == 1 and c["passed"] is False and "no boot timeline" in c["detail"]


# ------------------------------------------------------------------ the manifest's section


def test_selftest_section_round_trips_and_is_optional(work):
    write_package(work / "new", reference())
    ref = open_package(work / "new", verify="none").manifest.selftest
    assert ref.text == TEXT and ref.min_cosine == 0.9999 and ref.boot_budget_ms == 1500.0
    np.testing.assert_array_equal(np.asarray(ref.embedding, dtype=np.float32), REFERENCE)
    assert ref.fresh_boot_budget_ms == {} and ref.fresh_budget("fake") is None  # built before the fresh budget
    fresh_package(work / "fresh")
    assert open_package(work / "fresh" / "pkg", verify="none").manifest.selftest.fresh_budget("fake") == 9000.0
    write_package(work / "old")
    assert open_package(work / "old", verify="none").manifest.selftest is None


@pytest.mark.parametrize("edit,where", [
    (lambda r: r.update(embedding=r["embedding"][:-1]), "selftest.embedding"),
    (lambda r: r.update(embedding=[0.0] * DIM), "selftest.embedding"),
    (lambda r: r["embedding"].__setitem__(0, "x"), "selftest.embedding.0"),
    (lambda r: r.update(text="  "), "selftest.text"),
    (lambda r: r.pop("text"), "selftest.text"),
    (lambda r: r.update(min_cosine=1.5), "selftest.min_cosine"),
    (lambda r: r.update(min_cosine=0), "selftest.min_cosine"),
    (lambda r: r.update(boot_budget_ms=-1), "selftest.boot_budget_ms"),
    (lambda r: r.update(computed_with=[]), "selftest.computed_with"),
    (lambda r: r.update(fresh_boot_budget_ms=[]), "selftest.fresh_boot_budget_ms"),
    (lambda r: r.update(fresh_boot_budget_ms={"fake": 0}), "selftest.fresh_boot_budget_ms.fake"),
    (lambda r: r.update(fresh_boot_budget_ms={"fake": "x"}), "selftest.fresh_boot_budget_ms.fake"),
    (lambda r: r.update(fresh_boot_budget_ms={"torchscript": 5000}), "selftest.fresh_boot_budget_ms.torchscript"),
])
def test_invalid_selftest_section_is_refused(work, edit, where):
    section = reference()
    edit(section)
    write_package(work / "pkg", section, engines={"fake": {"files": []}})
    with pytest.raises(PackageError) as info:
        open_package(work / "pkg", verify="none")
    assert info.value.code == ErrorCode.PACKAGE_INVALID and f"manifest.json: {where}:" in str(info.value)


def test_default_budget_is_edge_coldstarts():
    """One figure for "the boot budget": edge-coldstart's --budget-ms default."""
    from bench.coldstart.report import DEFAULT_BUDGET_MS

    assert DEFAULT_BOOT_BUDGET_MS == DEFAULT_BUDGET_MS
