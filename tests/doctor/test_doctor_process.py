"""``edge doctor`` on this machine: its real root (commands, engines, systemd or not) in a process
of its own, and the real runtime serving the real package; the commands' timeouts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge.commands import doctor
from edge.commands.doctor.context import Host
from support.doctor_fakes import checks, main
from support.pythonpath import child_env

pytestmark = pytest.mark.process  # runs this machine's commands and the engines' imports

REPO = Path(__file__).resolve().parents[2]
JETSON_CHECKS = ("l4t", "module", "nvpmodel", "clocks")
# `edge doctor ARGV` as its own process, as edge/cli.py wires it (the tests' copy of the wiring
# until edge/cli.py has it: support.doctor_fakes.main uses edge/cli.py's once it does); the
# child imports support through PYTHONPATH (support.pythonpath.child_env).
DRIVER = """
import sys
from support.doctor_fakes import main
rc, out, err = main(sys.argv[1:])
sys.stdout.write(out)
sys.stderr.write(err)
sys.exit(rc)
"""


def _doctor(*argv: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", DRIVER, *argv], capture_output=True, text=True, timeout=timeout_s,
                          cwd=REPO, env=child_env())


def test_this_machine_gives_a_complete_report():
    t0 = time.monotonic()
    proc = _doctor("--json")
    elapsed = time.monotonic() - t0
    assert "Traceback" not in proc.stderr and proc.stderr == "", proc.stderr
    report = json.loads(proc.stdout)
    c = checks(report)
    assert proc.returncode == report["summary"]["exit_status"] == (1 if report["summary"]["failed"] else 0)
    assert report["root"] == "/" and report["address"] is not None
    for check in c.values():
        assert check["verdict"] in ("PASS", "WARN", "FAIL", "N/A")
        assert (check["fix"] is not None) == (check["verdict"] in ("WARN", "FAIL")), check
    jetson = os.path.exists("/etc/nv_tegra_release")
    if not jetson:  # this build host: the Jetson checks do not apply, they never fail
        assert {n: c[n]["verdict"] for n in JETSON_CHECKS} == dict.fromkeys(JETSON_CHECKS, "N/A")
    assert not {"l4t", "module", "nvpmodel", "clocks", "cuda"} & set(report["summary"]["failed"]), report["summary"]
    # the running system's commands ran: engines probed, runc asked
    assert set(c["cuda"]["measured"]["engines"]) == {"onnxruntime", "torch"}
    assert c["runc"]["verdict"] != "N/A" and c["criu"]["verdict"] != "N/A"
    if not os.path.isdir("/run/systemd/system"):
        assert c["unit"]["verdict"] == "N/A" and c["unit"]["detail"].startswith("systemd is not the init system")
    assert report["summary"]["elapsed_ms"] / 1000 < elapsed < 90


def test_this_machine_as_a_table():
    proc = _doctor()
    assert proc.stderr == "" and proc.returncode in (0, 1)
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines[1:-1] if not line.startswith(" ")] == list(doctor.CHECKS)
    assert lines[-1].startswith("edge doctor: ")


def test_importing_doctor_loads_only_the_standard_library():
    """edge's parser imports it: no zmq, numpy or pydantic, nothing of edge.ipc (the checks load lazily)."""
    probe = ("import sys; before = set(sys.modules); import edge.commands.doctor; "
             "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in "
             "('zmq', 'numpy', 'pydantic', 'msgpack', 'onnxruntime', 'torch') or m.startswith('edge.ipc')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_engine_probe_reads_the_installed_engines(tmp_path):
    args = type("Args", (), {"root": "/", "bundle": None, "unit": "edge", "package": None, "budget_ms": None,
                             "coldstart": None, "timeout": 1.0})()
    ctx = doctor.make_context(args, "ipc:///nonexistent/edge.sock", None)
    engines = ctx.engines
    assert set(engines) == {"onnxruntime", "torch"}
    import onnxruntime

    assert engines["onnxruntime"]["version"] == onnxruntime.__version__
    assert engines["onnxruntime"]["providers"] == onnxruntime.get_available_providers()


def test_commands_are_killed_at_their_timeout_with_their_children():
    host = Host()
    t0 = time.monotonic()
    ran = host.run(["sh", "-c", "sleep 30 & sleep 30"], timeout_s=0.5)  # the child keeps the pipes open
    assert time.monotonic() - t0 < 5.0
    assert ran.rc is None and ran.error == "timed out after 0.5 s"
    ran = host.run(["/nonexistent/runc", "--version"])
    assert ran.rc is None and ran.error == "No such file or directory"
    t0 = time.monotonic()
    both = host.run_all([["sleep", "30"], ["sh", "-c", "echo ok"]], timeout_s=0.5)
    assert time.monotonic() - t0 < 5.0
    assert both[0].error == "timed out after 0.5 s" and (both[1].rc, both[1].out) == (0, "ok\n")


# ------------------------------------------------------------------ the real runtime


@pytest.fixture(scope="module")
def runtime(minilm_package, tmp_path_factory):
    from support.runtime_proc import running_runtime

    with running_runtime(tmp_path_factory.mktemp("doctor"), "--package", str(minilm_package), "--engine", "onnxruntime") as rt:
        yield rt


def test_real_runtime_boot_within_the_packages_budget(runtime, minilm_package):
    rc, out, err = main(["--json", "--connect", runtime.address, "--package", str(minilm_package)])
    report = json.loads(out)
    c = checks(report)
    assert c["service"]["verdict"] == "PASS", c["service"]
    assert c["service"]["measured"]["lineage"]["engine"] == "onnxruntime"
    budget = c["boot_budget"]
    assert budget["verdict"] == "PASS", budget
    assert budget["measured"]["budget_source"] == "the package's"
    assert 0 < budget["measured"]["exec_to_ready_ms"] <= budget["measured"]["budget_ms"]
    assert budget["measured"]["slowest_stage"]["stage"]
    assert c["socket"]["verdict"] == "PASS" and "mode 0660" in c["socket"]["detail"]
    assert rc == report["summary"]["exit_status"] and err == ""


@pytest.mark.gpu
def test_cuda_is_seen_where_a_gpu_is():
    if not (os.path.exists("/dev/nvidia0") or os.path.exists("/etc/nv_tegra_release")):
        pytest.skip("no NVIDIA GPU on this machine")
    proc = _doctor("--json")
    c = checks(json.loads(proc.stdout))["cuda"]
    engines = c["measured"]["engines"]
    ort = engines["onnxruntime"].get("providers", [])
    if not (engines.get("torch", {}).get("cuda") or "CUDAExecutionProvider" in ort):
        pytest.skip(f"no installed engine is a CUDA build here: {c['detail']}")
    assert c["verdict"] == "PASS", c
