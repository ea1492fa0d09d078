"""``edge doctor``'s checks of the running system with its commands answered by a FakeHost
(runc, CRIU, the unit, the engines, the snapshot's machine dependencies), and against a server
in this process on a real ipc:// socket: ready, within or over the boot budget, another
package, one that never answers, one this user may not reach."""

from __future__ import annotations

import os
import platform
import socket
import time

import pytest

from support.doctor_fakes import (PACKAGE_SHA, SHA, FakeHost, checks, context, install_bundle, one, orin_root,
                                  report_of, take_snapshot)
from edge.commands.doctor.context import Ran
from edge.commands.doctor.report import Verdict

RUNC = (0, "runc version 1.1.12\ncommit: v1.1.12-0-g51d5e946\nspec: 1.0.2-dev\ngo: go1.20.13\nlibseccomp: 2.5.4\n")
CRIU = (0, "Version: 4.1.1\nGitID: v4.1.1-edge1\n")


# ------------------------------------------------------------------ the running system's commands


def test_runc_and_criu_versions(root):
    install_bundle(root, arch=os.uname().machine, cdi=False)
    ctx = context(root, FakeHost({"runc": RUNC, "criu": CRIU}))
    assert one(ctx, "runc").detail == "runc 1.1.12 (/usr/sbin/runc)"
    assert one(ctx, "criu").verdict is Verdict.PASS and "the edge build" in one(ctx, "criu").detail
    c = one(context(root, FakeHost({"criu": (0, "Version: 4.1\n")})), "criu")
    assert c.verdict is Verdict.PASS and "stock build" in c.detail
    c = one(context(root, FakeHost({"criu": (0, "Version: 3.17.1\n")})), "criu")
    assert c.verdict is Verdict.WARN and "older than 4.1" in c.detail and "CRIU >= 4.1" in c.fix
    c = one(context(root, FakeHost({})), "criu")
    assert c.verdict is Verdict.WARN and "fresh boot" in c.detail
    c = one(context(root, FakeHost({})), "runc")
    assert c.verdict is Verdict.FAIL and "edge.service runs the bundle with it" in c.detail
    c = one(context(root, FakeHost({"runc": (1, "")})), "runc")
    assert c.verdict is Verdict.FAIL and "/usr/sbin/runc --version failed (exit 1)" in c.detail


def test_snapshot_compares_the_machine_on_the_running_system(root):
    from edge.commands.doctor.tools import cpu_model

    host = FakeHost({"runc": RUNC, "criu": CRIU})
    bundle = install_bundle(root, arch=os.uname().machine, cdi=False)
    machine = {"kernel": platform.release(), "cpu": cpu_model(), "runc": "; ".join(RUNC[1].split("\n")[:-1]),
               "criu": "Version: 4.1.1; GitID: v4.1.1-edge1"}
    take_snapshot(root, bundle, **machine)
    assert one(context(root, host), "snapshot").verdict is Verdict.PASS
    take_snapshot(root, bundle, **{**machine, "criu": "Version: 4.1.0"})
    c = one(context(root, host), "snapshot")
    assert c.verdict is Verdict.WARN and list(c.measured["changed"]) == ["criu"]


@pytest.mark.parametrize("show, verdict, words", [
    ("LoadState=loaded\nActiveState=active\nSubState=running\nResult=success\nNRestarts=0\nUnitFileState=enabled\n",
     Verdict.PASS, "edge.service active (running), result success, 0 restarts"),
    ("LoadState=loaded\nActiveState=active\nSubState=running\nResult=success\nNRestarts=2\n", Verdict.WARN,
     "2 restarts"),
    ("LoadState=loaded\nActiveState=failed\nSubState=failed\nResult=watchdog\nNRestarts=5\n", Verdict.FAIL,
     "result watchdog"),
    ("LoadState=loaded\nActiveState=inactive\nSubState=dead\nResult=success\nUnitFileState=disabled\n",
     Verdict.WARN, "stopped"),
    ("LoadState=not-found\nActiveState=inactive\nSubState=dead\n", Verdict.WARN, "not installed"),
])
def test_unit_states(root, show, verdict, words):
    c = one(context(root, FakeHost({"systemctl": (0, show)})), "unit")
    assert c.verdict is verdict and words in c.detail


def test_unit_without_systemd_is_not_applicable(root):
    c = one(context(root, FakeHost({"systemctl": (1, "")}, init="process_api")), "unit")
    assert c.verdict is Verdict.NA and c.detail == "systemd is not the init system here (PID 1 is process_api)"


CPU_ORT = {"version": "1.20.0", "providers": ["CPUExecutionProvider"]}
CUDA_ORT = {"version": "1.20.0", "providers": ["TensorrtExecutionProvider", "CUDAExecutionProvider",
                                               "CPUExecutionProvider"]}


@pytest.mark.parametrize("gpu_bundle, ort, verdict", [
    (True, CUDA_ORT, Verdict.PASS),
    (True, CPU_ORT, Verdict.FAIL),
    (True, Ran([], None, error="timed out after 30 s"), Verdict.WARN),
    (True, {"missing": "No module named 'onnxruntime'"}, Verdict.WARN),
    (False, CPU_ORT, Verdict.WARN),  # a Jetson whose engines see no CUDA: a cpu bundle still runs
    (False, CUDA_ORT, Verdict.PASS),
])
def test_cuda_on_a_jetson(root, gpu_bundle, ort, verdict):
    orin_root(root)
    install_bundle(root, arch="aarch64", cdi=gpu_bundle)
    host = FakeHost({"engine:onnxruntime": ort})
    c = one(context(root, host), "cuda")
    assert c.verdict is verdict, c
    assert sorted(a[-1] for a in host.ran) == ["onnxruntime", "torch"]


def test_cuda_without_a_gpu_is_not_applicable(root):
    c = one(context(root, FakeHost({"engine:onnxruntime": CPU_ORT})), "cuda")
    assert c.verdict is Verdict.NA and c.detail.startswith("no NVIDIA GPU on this machine (onnxruntime 1.20.0")


def test_a_check_that_raises_is_reported_and_the_others_run(root, host, monkeypatch):
    from edge.commands.doctor import device

    monkeypatch.setattr(device, "check_module", lambda ctx: 1 / 0)
    c = checks(report_of(root, host=host, rc=0))
    assert c["module"]["verdict"] == "WARN" and c["module"]["detail"] == (
        "the check itself failed: ZeroDivisionError: division by zero")
    assert c["nvpmodel"]["verdict"] == "N/A"


# ------------------------------------------------------------------ a server: in-process, real socket


@pytest.fixture
def serve(root):
    """serve(timeline, package_sha256): a fake-engine server at the bundle's address under ``root``."""
    from edge.ipc.protocol import Lineage
    from edge.ipc.server import IpcServer
    from edge.serving.core import ServingCore
    from support.ipc_fakes import FakeEngine, FakeTokenizer

    servers = []

    def make(timeline: dict, package_sha256: str = PACKAGE_SHA) -> IpcServer:
        engine = FakeEngine()
        core = ServingCore(engine, FakeTokenizer(), {"buckets": [8, 16], "max_batch_size": 4, "max_batch_tokens": 64,
                                                     "max_delay_ms": 2.0, "max_queue_requests": 16,
                                                     "max_queue_tokens": 1024}, max_seq_length=16)
        lineage = Lineage(model="fake", package_sha256=package_sha256, bundle_sha256=SHA, engine=engine.name,
                          device=engine.device)
        server = IpcServer(f"ipc://{root}/run/edge/edge.sock", core, lineage, timeline=lambda: dict(timeline))
        servers.append(server)
        server.bind()
        server.start(ready=True)
        return server

    yield make
    for s in servers:
        s.request_drain()
        assert s.wait(20.0), "server did not stop within 20 s"


TIMELINE = {"stages": [{"stage": "import_engine", "start_ms": 20.0, "end_ms": 300.0, "duration_ms": 280.0},
                       {"stage": "warm_up", "start_ms": 300.0, "end_ms": 410.0, "duration_ms": 110.0}],
            "exec_to_ready_ms": 420.0, "pid": 4242, "start": "fresh"}


def test_running_server_within_the_budget(root, host, serve):
    orin_root(root)
    install_bundle(root)
    serve(TIMELINE)
    report = report_of(root, host=host, rc=0)
    c = checks(report)
    assert c["service"]["verdict"] == "PASS" and c["service"]["detail"].startswith(f"ready at ipc://{root}/run/edge")
    assert c["boot_budget"]["verdict"] == "PASS"
    assert c["boot_budget"]["detail"] == ("exec to ready 420 ms, within the package's budget of 1500 ms; slowest stage "
                                          "import_engine 280 ms")
    assert c["socket"]["verdict"] == "PASS" and "edge.sock mode 0660" in c["socket"]["detail"]
    assert c["memory"]["verdict"] == "PASS" and "while the service runs" in c["memory"]["detail"]
    assert report["address_source"].endswith("current/edge-bundle.json")


def test_running_server_over_the_budget_fails(root, host, serve):
    orin_root(root)
    install_bundle(root, budget_ms=300.0)
    serve(TIMELINE)
    report = report_of(root, host=host, rc=1)
    assert report["summary"]["failed"] == ["boot_budget"]
    assert checks(report)["boot_budget"]["measured"]["budget_ms"] == 300.0
    c = checks(report_of(root, "--budget-ms", "500", host=host, rc=0))["boot_budget"]
    assert c["verdict"] == "PASS" and c["measured"]["budget_source"] == "--budget-ms"


def test_server_of_another_package_warns(root, host, serve):
    install_bundle(root, arch=os.uname().machine, cdi=False)
    serve(TIMELINE, package_sha256="77" * 32)
    c = checks(report_of(root, host=host))["service"]
    assert c["verdict"] == "WARN" and "it runs package 777777777777" in c["detail"]


def test_a_server_that_never_answers_costs_the_timeout_only(root, host):
    (root / "run").mkdir()
    with socket.socket(socket.AF_UNIX) as hung:  # accepts connections, never speaks
        hung.bind(str(root / "run/edge.sock"))
        hung.listen(8)
        t0 = time.monotonic()
        report = report_of(root, "--connect", f"ipc://{root}/run/edge.sock", "--timeout", "0.3", host=host, rc=0)
        assert time.monotonic() - t0 < 5.0
    c = checks(report)
    assert c["service"]["verdict"] == "N/A" and "within 0.3 s" in c["service"]["detail"]
    assert report["address_source"] == "--connect"




def test_a_socket_this_user_may_not_reach_is_a_warning_not_a_down_service(root, host):
    from edge.commands.doctor.context import ServerFacts

    ctx = context(root, host, "--connect", "ipc:///run/edge/edge.sock", system=False)
    ctx.__dict__["server"] = ServerFacts("ipc:///run/edge/edge.sock", error="/run/edge/edge.sock: permission denied "
                                                                            "to this user", denied=True)
    c = one(ctx, "service")
    assert c.verdict is Verdict.WARN and "as root" in c.fix
    assert one(ctx, "boot_budget").detail == "the server could not be asked (permission)"


def test_an_active_unit_whose_server_does_not_answer_fails(root):
    install_bundle(root, arch=os.uname().machine, cdi=False)
    show = "LoadState=loaded\nActiveState=active\nSubState=running\nResult=success\nNRestarts=0\n"
    ctx = context(root, FakeHost({"systemctl": (0, show)}))
    ctx.address = f"ipc://{root}/run/edge/edge.sock"
    c = one(ctx, "service")
    assert c.verdict is Verdict.FAIL and c.detail.startswith("edge.service is active and nothing answers")
    assert c.fix == "journalctl -u edge -b -n 50; systemctl restart edge"
