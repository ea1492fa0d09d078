"""``edge doctor`` on device roots made here (an AGX Orin's files, an empty root): every check that
reads files, its verdicts, fixes and exit status. A root other than / asks nothing of this
machine (test_doctor_running.py: the running system's commands and a server;
test_doctor_process.py: this machine's own root and the real runtime)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from support.doctor_fakes import (LIMIT_BYTES, MODEL, PACKAGE_BYTES, SHA, checks, coldstart_record, context,
                                  install_bundle, main, meminfo, one, orin_root, report_of, take_snapshot, write)
from edge.commands import doctor
from edge.commands.doctor.report import Verdict

JETSON_CHECKS = ("l4t", "module", "nvpmodel", "clocks")


# ------------------------------------------------------------------ whole reports


def test_orin_root_with_an_installed_gpu_bundle(root, host):
    orin_root(root)
    install_bundle(root)
    report = report_of(root, host=host, rc=0)
    c = checks(report)
    assert {n: c[n]["verdict"] for n in JETSON_CHECKS} == dict.fromkeys(JETSON_CHECKS, "PASS")
    assert c["l4t"]["measured"]["release"] == "36.3.0" and c["l4t"]["measured"]["board"] == "generic"
    assert c["module"]["detail"] == f"{MODEL} (nvidia,tegra234)"
    assert c["nvpmodel"]["detail"] == "mode 0 (MAXN), default 3 (MODE_50W)"
    assert "jetson_clocks off" in c["clocks"]["detail"]
    assert "GPU nvhost_podgov (17000000.ga10b)" in c["clocks"]["detail"]
    assert c["bundle"]["verdict"] == "PASS" and c["bundle"]["measured"]["slot"] == "a"
    assert c["cdi_devices"]["verdict"] == "PASS"
    assert c["cdi_devices"]["measured"]["deferred"] == ["/dev/nvhost-ctrl-gpu"]
    assert c["memory"]["verdict"] == "PASS" and c["memory"]["measured"]["need_bytes"] == PACKAGE_BYTES + LIMIT_BYTES
    assert c["install"]["verdict"] == "PASS" and "committed" in c["install"]["detail"]
    # not the running system: its commands are not run, the server at the bundle's address is down
    assert {n: c[n]["verdict"] for n in ("cuda", "runc", "criu", "unit")} == dict.fromkeys(
        ("cuda", "runc", "criu", "unit"), "N/A")
    assert c["service"]["verdict"] == "N/A" and c["service"]["detail"].startswith("service down")
    assert c["service"]["measured"]["address"] == f"ipc://{root}/run/edge/edge.sock"
    assert c["boot_budget"]["verdict"] == "N/A" and c["snapshot"]["verdict"] == "N/A"
    assert c["socket"]["verdict"] == "PASS" and "no socket file" in c["socket"]["detail"]
    assert c["coldstart"]["verdict"] == "N/A"
    assert host.ran == []
    assert report["summary"]["verdict"] == "PASS" and report["bundle"] == str(root / "opt/edge/bundle/current")


def test_empty_root_is_not_applicable_not_failed(root, host):
    report = report_of(root, host=host, rc=0)
    c = checks(report)
    assert {n: c[n]["verdict"] for n in JETSON_CHECKS} == dict.fromkeys(JETSON_CHECKS, "N/A")
    assert c["l4t"]["detail"] == f"not a Jetson: no {root}/etc/nv_tegra_release"
    assert c["bundle"]["verdict"] == "WARN" and "edge-bundle install" in c["bundle"]["fix"]
    assert report["summary"]["failed"] == [] and report["summary"]["warned"] == ["bundle"]
    assert report["address"] is None and host.ran == []


def test_table_has_a_row_per_check_and_a_fix_under_each_warning(root, host):
    orin_root(root, mode=None)
    rc, out, err = main(["--root", str(root)], host=host)
    lines = out.splitlines()
    assert rc == 0 and err == "" and lines[0].split() == ["CHECK", "VERDICT", "DETAIL"]
    rows = [line.split()[0] for line in lines[1:-1] if not line.startswith(" ")]
    assert rows == list(doctor.CHECKS)
    i = next(i for i, line in enumerate(lines) if line.startswith("nvpmodel "))
    assert lines[i].split()[1] == "WARN" and lines[i + 1].strip() == "fix: sudo nvpmodel -m 3"
    assert lines[-1].startswith("edge doctor: WARN; ")


# ------------------------------------------------------------------ FAIL cases: exit 1


def test_socket_dir_with_a_wrong_mode_fails(root, host):
    orin_root(root)
    install_bundle(root)
    os.chmod(root / "run/edge", 0o755)
    c = checks(report_of(root, host=host, rc=1))
    assert c["socket"]["verdict"] == "FAIL" and "mode 0755" in c["socket"]["detail"]
    assert c["socket"]["fix"].startswith(f"chown {os.getuid()}:{os.getgid()} {root}/run/edge && chmod 0750")


def test_socket_file_open_to_others_fails(root, host):
    orin_root(root)
    install_bundle(root)
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(root / "run/edge/edge.sock"))
        os.chmod(root / "run/edge/edge.sock", 0o666)
    c = checks(report_of(root, host=host, rc=1))
    assert c["socket"]["verdict"] == "FAIL" and "mode 0666" in c["socket"]["detail"]
    assert c["service"]["verdict"] == "N/A" and "nothing listens" in c["service"]["detail"]


def test_missing_cdi_device_node_fails(root, host):
    orin_root(root)
    install_bundle(root)
    (root / "dev/nvmap").unlink()
    c = checks(report_of(root, host=host, rc=1))
    assert c["cdi_devices"]["verdict"] == "FAIL"
    assert "/dev/nvmap: no such file or directory" in c["cdi_devices"]["detail"]
    assert "nvidia-ctk cdi generate" in c["cdi_devices"]["fix"]


def test_cdi_node_with_other_numbers_and_missing_deferred_node_and_bind_fail(root, host):
    orin_root(root)
    bundle = install_bundle(root)
    (root / "dev/nvmap").unlink()
    (root / "dev/nvmap").symlink_to("/dev/zero")  # the config's /dev/null numbers: assigned at another boot
    (root / "dev/nvhost-ctrl-gpu").unlink()
    os.rmdir(root / "usr/lib/aarch64-linux-gnu/nvidia")
    c = checks(report_of(root, host=host, rc=1))["cdi_devices"]
    null, zero = os.stat("/dev/null").st_rdev, os.stat("/dev/zero").st_rdev
    assert c["measured"]["problems"] == [
        f"/dev/nvmap: config.json has c {os.major(null)}:{os.minor(null)}, the device has c {os.major(zero)}:"
        f"{os.minor(zero)} (numbers assigned at boot)",
        "/dev/nvhost-ctrl-gpu: no such file or directory",
        "bind mount source /usr/lib/aarch64-linux-gnu/nvidia (for /usr/lib/aarch64-linux-gnu/nvidia): missing"]
    assert bundle.is_dir()


def test_cpu_bundle_needs_no_device(root, host):
    install_bundle(root, arch=os.uname().machine, cdi=False)
    (root / "etc/edge").mkdir(parents=True)
    c = checks(report_of(root, host=host, rc=0))
    assert c["cdi_devices"]["verdict"] == "PASS" and c["cdi_devices"]["detail"] == "none needed (cpu bundle)"


@pytest.mark.parametrize("l4t, devices, failed", [
    ({"min": "35.0", "max": "35.6"}, [], "l4t"),
    ({"min": "36.0", "max": "36.3"}, ["nvidia,p3767-0000"], "module"),  # an Orin Nano's bundle on an AGX Orin
])
def test_bundle_for_another_release_or_module_fails(root, host, l4t, devices, failed):
    orin_root(root)
    install_bundle(root, l4t=l4t, devices=devices)
    report = report_of(root, host=host, rc=1)
    assert report["summary"]["failed"] == [failed]
    assert "edge-bundle install" in checks(report)[failed]["fix"]


def test_jetson_bundle_on_another_machine_fails(root, host):
    install_bundle(root, l4t={"min": "36.0"}, devices=["nvidia,tegra234"])
    write(root / "etc/edge/device.json", json.dumps({"arch": "x86_64"}))
    report = report_of(root, host=host, rc=1)
    c = checks(report)
    assert report["summary"]["failed"] == ["l4t", "module", "bundle"]
    assert "needs L4T 36.0-any, and there is no" in c["l4t"]["detail"]
    assert "built for aarch64, this machine is x86_64" in c["bundle"]["detail"]


def test_usage_errors_exit_2(root, host):
    rc, out, err = main(["--root", str(root / "nowhere")], host=host)
    assert (rc, out) == (2, "") and err == f"edge doctor: --root {root}/nowhere: not a directory\n"
    rc, _, err = main(["--root", str(root), "--bundle", str(root / "b")], host=host)
    assert rc == 2 and "--bundle" in err and "no such directory" in err
    (root / "b").mkdir()
    rc, _, err = main(["--root", str(root), "--bundle", str(root / "b")], host=host)
    assert rc == 2 and "not a bundle" in err
    rc, _, err = main(["--root", str(root), "--package", str(root)], host=host)
    assert rc == 2 and "no manifest.json" in err
    rc, _, err = main(["--root", str(root), "--budget-ms", "-1"], host=host)
    assert rc == 2 and "above 0" in err


# ------------------------------------------------------------------ one check at a time


def test_nvpmodel_without_a_mode_or_with_an_unknown_one_warns(root, host):
    orin_root(root, mode=None)
    c = one(context(root, host, system=False), "nvpmodel")
    assert c.verdict is Verdict.WARN and c.fix == "sudo nvpmodel -m 3"
    write(root / "var/lib/nvpmodel/status", "pmode:0007 fmode:quiet\n")
    c = one(context(root, host, system=False), "nvpmodel")
    assert c.verdict is Verdict.WARN and c.detail.startswith("mode 7 is not one of")


def test_clocks_powersave_warns_and_jetson_clocks_is_seen(root, host):
    orin_root(root, governor="powersave")
    c = one(context(root, host, system=False), "clocks")
    assert c.verdict is Verdict.WARN and "sudo jetson_clocks" in c.fix and "cpu0, cpu1" in c.detail
    orin_root(root, pinned=True)
    c = one(context(root, host, system=False), "clocks")
    assert c.verdict is Verdict.PASS and "jetson_clocks on" in c.detail and c.measured["jetson_clocks"] is True


@pytest.mark.parametrize("available, verdict", [(PACKAGE_BYTES - 1, Verdict.FAIL), (LIMIT_BYTES, Verdict.WARN),
                                                (PACKAGE_BYTES + LIMIT_BYTES, Verdict.PASS)])
def test_memory_against_the_package_and_the_limit(root, host, available, verdict):
    orin_root(root)
    install_bundle(root)
    write(root / "proc/meminfo", meminfo(available))
    c = one(context(root, host, system=False), "memory")
    assert c.verdict is verdict, c
    assert c.measured["mem_available_bytes"] == available // 1024 * 1024


def test_snapshot_restorable_stale_or_partial(root, host):
    orin_root(root)
    bundle = install_bundle(root)
    snap = take_snapshot(root, bundle)
    c = one(context(root, host, system=False), "snapshot")
    assert c.verdict is Verdict.PASS and c.measured["path"] == str(snap) and "2 image files" in c.detail
    (snap / "images/pages-1.img").write_bytes(b"\0" * 10)
    c = one(context(root, host, system=False), "snapshot")
    assert c.verdict is Verdict.WARN and "pages-1.img is missing or not 4096 bytes" in c.detail
    take_snapshot(root, bundle, bundle_path="/opt/edge/slots/b/bundle")
    c = one(context(root, host, system=False), "snapshot")
    assert c.verdict is Verdict.WARN and c.detail.startswith("stale, taken for another bundle_path")
    (snap / "snapshot.json").write_text("{")
    c = one(context(root, host, system=False), "snapshot")
    assert c.verdict is Verdict.WARN and "not JSON" in c.detail


@pytest.mark.parametrize("trial, verdict, words", [
    ({"status": "on_trial", "slot": "a", "tries": 3, "tries_left": 2, "since": "t"}, Verdict.WARN, "2 of 3 tries left"),
    ({"status": "rolled_back", "slot": "a", "tries": 3, "tries_left": 0, "since": "t",
      "reason": "selftest failed: boot_budget"}, Verdict.WARN, "selftest failed: boot_budget"),
])
def test_install_on_trial_or_rolled_back_warns(root, host, trial, verdict, words):
    install_bundle(root, trial=trial)
    c = one(context(root, host, system=False), "install")
    assert c.verdict is verdict and words in c.detail


def test_install_state_unreadable_warns_and_absent_is_not_applicable(root, host):
    assert one(context(root, host, system=False), "install").verdict is Verdict.NA
    write(root / "var/lib/edge/install.json", "not json")
    c = one(context(root, host, system=False), "install")
    assert c.verdict is Verdict.WARN and c.fix.startswith("edge-bundle status")


def test_coldstart_reports_the_newest_record(root, host):
    old = coldstart_record(root / "var/cache/edge/coldstart/a.json", passed=True)
    new = coldstart_record(root / "var/cache/edge/coldstart/b.json", passed=False, median_ms=2100.0)
    write(root / "var/cache/edge/coldstart/other.json", json.dumps({"tool": "something"}))
    os.utime(old, (time.time() - 60, time.time() - 60))
    c = one(context(root, host, system=False), "coldstart")
    assert c.verdict is Verdict.WARN and c.detail.startswith("FAIL: exec to first reply 2100 ms")
    assert c.measured["record"] == str(new) and c.measured["records_found"] == 2
    c = one(context(root, host, "--coldstart", str(old), system=False), "coldstart")
    assert c.verdict is Verdict.PASS and c.measured["record"] == str(old)


# ------------------------------------------------------------------ the snapshot rule


def test_doctor_looks_for_the_snapshot_where_the_supervisor_does(root):
    """doctor's snapshot directory is edge/system/snapshot_rules.py's (edge-supervise's and
    edge-bundle snapshot's), as a Path: for a slot's bundle, in the cache; for any other, beside it."""
    from edge.commands.doctor.tools import SNAPSHOT_FORMAT, snapshot_dir
    from edge.system import snapshot_rules as rules

    slot = install_bundle(root)
    plain = root / "v3"
    plain.mkdir()
    write(plain / "edge-bundle.json", json.dumps({"bundle_sha256": SHA}))
    for bundle in (root / "opt/edge/bundle/current", slot, plain):
        assert snapshot_dir(bundle) == Path(rules.snapshot_dir(bundle)), bundle
    assert snapshot_dir(slot) == root / "var/cache/edge" / SHA / "snapshot"
    assert snapshot_dir(root / "opt/edge/bundle/current") == root / "var/cache/edge" / SHA / "snapshot"
    assert snapshot_dir(plain) == Path(f"{plain}.snapshot")
    assert SNAPSHOT_FORMAT == rules.SNAPSHOT_FORMAT


def test_default_budget_is_the_manifests(root, host):
    from edge.commands.doctor.service import _budget
    from edge.preload.manifest import DEFAULT_BOOT_BUDGET_MS

    assert _budget(context(root, host, system=False)) == (DEFAULT_BOOT_BUDGET_MS, "the default")
