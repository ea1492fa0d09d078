"""docs/field.md, run: every command of the technician's procedure, verbatim but for the unit's
name, on a device under a real systemd (PID 1 in systemd-nspawn, tests/support/trial_machine.py)
with real runc: check, install from a signed archive, wait for the commit, the self-test, then
``edge-coldstart --unit edge --runs 5``. The record's verdict against the package's budget must be
the one its median gives (PASS here on a usual day; a busy day's FAIL exits 1, as on a device), and
every run's phases, from four independent clocks, must add up to its total within 5 %.

Needs root, runc and systemd-nspawn; skipped otherwise. About 2 minutes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.coldstart.unit_runs import UNIT_PHASES
from edge.update.install.installer import install, mark_good
from edge.update.install.layout import DeviceLayout
from support.archives import keygen
from support.trial_machine import Machine, nspawn_or_skip, variant_bundle

REPO = Path(__file__).resolve().parents[2]
FIELD = REPO / "docs" / "field.md"
SOCKET_DIR = "/run/edge"  # the machine's own /run: the default address, as on a device
PHASE_SUM_TOLERANCE = 0.05


def field_commands() -> list[str]:
    """Every command of docs/field.md: the lines of its ```sh blocks, in order."""
    blocks = re.findall(r"^```sh\n(.*?)^```", FIELD.read_text(), re.S | re.M)
    return [line.strip() for b in blocks for line in b.splitlines() if line.strip() and not line.startswith("#")]


def for_unit(command: str, unit: str) -> str:
    """The command with the test machine's unit name (nspawn shares the host's cgroup tree, so
    the unit cannot be called edge here)."""
    return re.sub(r"(--unit|-u) edge\b", rf"\1 {unit}", command)


def test_field_md_is_the_procedure():
    """The page holds the four steps the procedure promises, each as a command a test runs."""
    commands = field_commands()
    starts = [c.split()[0] + (" " + c.split()[1] if c.split()[0] in ("edge", "edge-bundle") else "") for c in commands]
    for step in ("edge doctor", "edge-bundle verify-archive", "edge-bundle install", "edge-bundle status",
                 "edge selftest", "edge-coldstart", "journalctl", "tar"):
        assert step in starts, (step, commands)
    assert "edge-coldstart --unit edge --runs 5 --json /var/tmp/edge-ticket/coldstart.json" in commands
    assert for_unit("journalctl -u edge -b", "edge-t1") == "journalctl -u edge-t1 -b"
    assert for_unit("edge-bundle install X --unit edge", "edge-t1") == "edge-bundle install X --unit edge-t1"


def test_unit_mode_refuses_where_systemd_is_not_pid_1():
    """Here (no systemd as PID 1) --unit is refused at once, exit 2, naming the modes to use."""
    if Path("/proc/1/comm").read_text().strip() == "systemd":
        pytest.skip("systemd is PID 1 on this machine: the refusal is tested in the machine below")
    r = subprocess.run([sys.executable, "-m", "bench.coldstart.cli", "--unit", "--runs", "1", "--json",
                        "/tmp/edge-coldstart-refused.json"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2, r
    assert "systemd is not PID 1" in r.stderr and "--bundle" in r.stderr and "--package" in r.stderr, r.stderr


@pytest.fixture(scope="module")
def field_archives(ort_bundle, tmp_path_factory) -> dict:
    """v1 (flashed) and v2 (the technician's USB stick), signed; the socket directory /run/edge."""
    nspawn_or_skip()
    from image.archive.pack import pack_bundle

    work = tmp_path_factory.mktemp("field-archives")
    private, public = keygen(work / "keys")
    out = {"dir": work / "archives", "public": public, "digest": {}}
    out["dir"].mkdir()
    for tag in ("v1", "v2"):
        b = variant_bundle(ort_bundle, work / tag, socket_dir=SOCKET_DIR, tag=tag)
        out["digest"][tag] = json.loads((b / "edge-bundle.json").read_text())["bundle_sha256"]
        pack_bundle(b, private, out["dir"] / f"{tag}.edgebundle", level=1)
    return out


SCENARIO = r'''
import json, os, re, subprocess, time
from trial_probe import *

COMMANDS = json.loads(os.environ["FIELD_COMMANDS"])
ENV = {**os.environ, "PATH": f"{BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
os.makedirs("/media/usb")
os.symlink("/archives/v2.edgebundle", "/media/usb/edge.edgebundle")
RESULT["start"] = sh("systemctl", "start", UNIT)  # as at power-on (the unit is enabled on a device)
RESULT["commands"] = []


def run(cmd):
    t0 = time.monotonic()
    r = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True, env=ENV, timeout=600)
    return {"cmd": cmd, "rc": r.returncode, "out": r.stdout[-4000:], "err": r.stderr[-4000:],
            "seconds": round(time.monotonic() - t0, 3)}


for cmd in COMMANDS:
    if cmd == "edge-bundle status":  # the page: run it again until it exits 0 (committed)
        for _ in range(240):
            got = run(cmd)
            if got["rc"] == 0:
                break
            time.sleep(0.5)
    else:
        got = run(cmd)
    RESULT["commands"].append(got)
    if cmd.startswith("edge-bundle install"):  # on trial now: the benchmark must refuse, restart nothing
        RESULT["early_refusal"] = run(os.environ["FIELD_COLDSTART"])
RESULT["not_installed"] = run("edge-coldstart --unit no-such-unit --runs 1 --json /tmp/x.json")
try:
    with open("/var/tmp/edge-ticket/coldstart.json") as f:
        RESULT["record"] = json.load(f)
    RESULT["ticket"] = sorted(os.listdir("/var/tmp/edge-ticket"))
    RESULT["tarball"] = os.path.getsize("/var/tmp/edge-ticket.tar.gz")
except OSError as exc:
    RESULT["record_error"] = repr(exc)
finish()
'''


def test_field_procedure_under_systemd(tmp_path, field_archives, capsys):
    m = Machine(tmp_path, field_archives["public"], archives=field_archives["dir"], sustain_s=8.0, interval_s=0.5)
    layout = DeviceLayout(m.root)
    install(field_archives["dir"] / "v1.edgebundle", layout, restart=False)  # as flashed at the factory
    mark_good(layout)
    # Snapshot boot on, as shipped: each run reports its start path and what became of the snapshot
    # edge-supervise takes after a fresh start. In this machine CRIU cannot checkpoint (nspawn's
    # seccomp filter stops PTRACE_O_SUSPEND_SECCOMP; without it, CRIU's cgroup walk fails), so every
    # start is fresh and the record carries CRIU's reason.
    with open(m.root / "etc/default/edge", "a") as f:
        f.write("EDGE_SNAPSHOT=auto\n")
    commands = [for_unit(c, m.unit) for c in field_commands()]
    coldstart = next(c for c in commands if c.startswith("edge-coldstart"))
    scenario = SCENARIO.replace('os.environ["FIELD_COMMANDS"]', repr(json.dumps(commands))) \
                       .replace('os.environ["FIELD_COLDSTART"]', repr(coldstart))
    r = m.boot(scenario, timeout_s=540)
    assert r["start"]["rc"] == 0, m.log_tail()
    # Every command exits 0, but the benchmark's verdict is this machine's speed: it exits 1 on a
    # FAIL, which a busy day here gives (the budget is the Jetson's 1500 ms). It must then be a
    # FAIL that its own figures bear out; a PASS must be one too.
    verdict_rc = 0 if r.get("record", {}).get("summary", {}).get("pass") else 1
    failed = [c for c in r["commands"] if c["rc"] != (verdict_rc if c["cmd"] == coldstart else 0)]
    assert not failed, json.dumps(failed, indent=1)[-6000:]
    early = r.get("early_refusal")
    assert early and early["rc"] == 2 and "on trial" in early["err"], early
    assert r["not_installed"]["rc"] == 2 and "is not installed" in r["not_installed"]["err"], r["not_installed"]
    assert {"doctor.json", "status.json", "coldstart.json", "coldstart.png", "journal.txt"} <= set(r["ticket"])
    record = r["record"]
    s = record["summary"]
    assert record["config"]["mode"] == "unit" and record["config"]["unit"] == f"{m.unit}.service"
    assert s["budget_ms"] == 1500.0  # the package's own selftest.boot_budget_ms
    if s["median_ms"] <= s["budget_ms"]:
        assert s["pass"] and s["verdict"].startswith("PASS: restart to first reply"), s["verdict"]
    else:
        assert not s["pass"] and s["verdict"].startswith("FAIL: restart to first reply"), s["verdict"]
        assert s["verdict"].endswith("ms (median) over the budget of 1500 ms"), s["verdict"]
    assert record["runs"] and len(record["runs"]) == 5 and not record["failures"], record["failures"]
    for pair in record["runs"]:
        run = pair["runtime"]
        phases = run["phases"]
        assert all(phases.get(k) for k in UNIT_PHASES), (sorted(phases), run)
        spans = [phases[k] for k in UNIT_PHASES]
        assert all(b >= a for a, b in spans), spans
        total, summed = run["total_ms"], sum(b - a for a, b in spans)
        assert abs(total - summed) <= PHASE_SUM_TOLERANCE * total, (total, summed, phases)
        assert run["reply"]["start"] in ("fresh", "restored"), run["reply"]
        # edge-supervise's own account: a fresh start takes a snapshot, which the run waits out
        assert run["reply"]["snapshot_after"]["snapshot"] in ("taken", "failed", "none"), run["reply"]
        assert run["reply"]["package_sha256"], run["reply"]
    paths = s["start_paths"]
    assert sum(paths.values()) == 5
    with capsys.disabled():
        med = s["phase_medians_ms"]
        print(f"\n[field] edge-coldstart --unit: median {s['median_ms']} ms (p95 {s['p95_ms']}), start paths {paths}, "
              f"baseline {s['baseline_median_ms']} ms; phases (median ms): "
              + ", ".join(f"{k} {med[k]}" for k in UNIT_PHASES)
              + f"; largest unaccounted share {s['unaccounted_max_share']}; after run 1: "
              + json.dumps(record["runs"][0]["runtime"]["reply"]["snapshot_after"])[:400]
              + f"; run 2 not restored because: {str(record['runs'][1]['runtime']['reply'].get('not_restored'))[:300]}")
