"""Device roots for ``edge doctor``'s tests, a host whose commands answer from a table, and the
command line as edge/cli.py wires it.

``orin_root``: the files an AGX Orin on L4T R36.3 shows (release, device tree, nvpmodel, cpufreq,
the GPU's devfreq, meminfo). ``install_bundle``: an installed slot's bundle in such a root, as
edge-bundle install leaves it (slot a, ``current``, install.json), with CDI device nodes that
are links to /dev/null and /dev/zero (a test cannot make device nodes; a link to one is read
as the node). The bundle's socket directory and address are the device's ``/run/edge``, read
under the root.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import stat
from pathlib import Path

from edge import cli

from edge.commands import doctor
from edge.commands.doctor.context import Host, Ran

SHA = "5e" * 32
PACKAGE_SHA = "9b" * 32
RELEASE = ("# R36 (release), REVISION: 3.0, GCID: 36191598, BOARD: generic, EABI: aarch64, "
           "DATE: Mon May  6 17:34:21 UTC 2024\n# KERNEL_VARIANT: oot\nTARGET_USERSPACE_LIB_DIR=nvidia\n")
MODEL = "NVIDIA Jetson AGX Orin Developer Kit"
COMPATIBLE = ["nvidia,p3737-0000+p3701-0005", "nvidia,p3701-0005", "nvidia,tegra234"]
NVPMODEL_CONF = """< PARAM TYPE=FILE NAME=CPU_ONLINE >
CORE_0 /sys/devices/system/cpu/cpu0/online
< POWER_MODEL ID=0 NAME=MAXN >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=1 NAME=MODE_15W >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=2 NAME=MODE_30W >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=3 NAME=MODE_50W >
CPU_ONLINE CORE_0 1
< PM_CONFIG DEFAULT=3 >
"""
GIB = 1 << 30
PACKAGE_BYTES = 180 << 20
LIMIT_BYTES = 1831 << 20


class FakeHost(Host):
    """The machine's commands answered from ``answers``: command name -> (rc, stdout) or a Ran;
    the engine probes as ``engine:onnxruntime`` / ``engine:torch`` -> the probe's JSON (a dict)."""

    def __init__(self, answers: dict | None = None, init: str = "systemd") -> None:
        self.answers = dict(answers or {})
        self.init = init
        self.ran: list[list[str]] = []

    def which(self, name: str) -> str | None:
        return f"/usr/sbin/{name}" if name in self.answers else None

    def init_system(self) -> str:
        return self.init

    def start(self, argv: list[str]):
        import json

        self.ran.append(list(argv))
        if argv[1:2] == ["-c"]:  # an engine probe
            answer = self.answers.get(f"engine:{argv[-1]}", {"missing": f"No module named {argv[-1]!r}"})
            return answer if isinstance(answer, Ran) else Ran(argv, 0, "\n" + json.dumps(answer) + "\n")
        answer = self.answers[Path(argv[0]).name]
        return answer if isinstance(answer, Ran) else Ran(argv, answer[0], answer[1])


def write(path: Path, text: str | bytes, mode: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    if mode is not None:
        os.chmod(path, mode)
    return path


def meminfo(available: int, total: int = 32 * GIB) -> str:
    return f"MemTotal:       {total // 1024} kB\nMemFree:        {available // 2048} kB\n" \
           f"MemAvailable:   {available // 1024} kB\n"


def orin_root(root: Path, *, governor: str = "schedutil", pinned: bool = False, mode: int | None = 0) -> Path:
    write(root / "etc/nv_tegra_release", RELEASE)
    write(root / "proc/device-tree/model", MODEL + "\0")
    write(root / "proc/device-tree/compatible", "\0".join(COMPATIBLE) + "\0")
    write(root / "etc/nvpmodel.conf", NVPMODEL_CONF)
    if mode is not None:
        write(root / "var/lib/nvpmodel/status", f"pmode:{mode:04d} fmode:quiet\n")
    for i in range(12):
        d = root / f"sys/devices/system/cpu/cpu{i}/cpufreq"
        write(d / "scaling_governor", governor + "\n")
        write(d / "scaling_min_freq", ("2201600" if pinned else "115200") + "\n")
        write(d / "scaling_max_freq", "2201600\n")
        write(d / "cpuinfo_max_freq", "2201600\n")
    write(root / "sys/devices/system/cpu/online", "0-11\n")
    gpu = root / "sys/class/devfreq/17000000.ga10b"
    write(gpu / "governor", "nvhost_podgov\n")
    write(gpu / "min_freq", ("1300500000" if pinned else "306000000") + "\n")
    write(gpu / "max_freq", "1300500000\n")
    write(gpu / "cur_freq", "306000000\n")
    write(root / "proc/meminfo", meminfo(28 * GIB))
    write(root / "etc/edge/device.json", json.dumps({"arch": "aarch64"}))
    return root


def _node(root: Path, path: str, target: str) -> dict:
    """ROOT/path as a link to the host's ``target`` node; its config.json device entry."""
    link = root / path.lstrip("/")
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    st = os.stat(target)
    return {"path": path, "type": "c" if stat.S_ISCHR(st.st_mode) else "b", "major": os.major(st.st_rdev),
            "minor": os.minor(st.st_rdev), "fileMode": 0o666, "uid": 0, "gid": 0}


def install_bundle(root: Path, *, arch: str = "aarch64", cdi: bool = True, budget_ms: float = 1500.0,
                   trial: dict | None = None, l4t: dict | None = None, devices: list[str] | None = None) -> Path:
    """An installed slot's bundle under ``root``; the slot's bundle directory."""
    bundle = root / "opt/edge/slots/a/bundle"
    (bundle / "rootfs").mkdir(parents=True)
    meta = {"format": 1, "bundle_sha256": SHA, "arch": arch, "engine": "onnxruntime",
            "device": "auto" if cdi else "cpu",
            "user": {"uid": os.getuid(), "gid": os.getgid()}, "socket_dir": "/run/edge",
            "address": "ipc:///run/edge/edge.sock", "container_socket_dir": "/run/edge",
            "package": {"path": "/opt/edge/package", "bytes": PACKAGE_BYTES, "name": "all-MiniLM-L6-v2",
                        "package_sha256": PACKAGE_SHA, "model_sha256": "27" * 32, "tokenizer_sha256": "3d" * 32},
            "sizes": {"package_bytes": PACKAGE_BYTES, "runtime_bytes": 121 << 20}, "cdi": None}
    config = {"ociVersion": "1.0.2", "root": {"path": "rootfs", "readonly": True},
              "process": {"user": {"uid": os.getuid(), "gid": os.getgid()}, "args": ["python3", "-m", "edge.boot"]},
              "mounts": [{"destination": "/run/edge", "type": "bind", "source": "/run/edge",
                          "options": ["rbind", "rw"]}],
              "linux": {"resources": {"memory": {"limit": LIMIT_BYTES, "swap": LIMIT_BYTES}, "pids": {"limit": 256}}}}
    if cdi:
        config["linux"]["devices"] = [_node(root, "/dev/nvmap", "/dev/null")]
        _node(root, "/dev/nvhost-ctrl-gpu", "/dev/zero")
        libs = "/usr/lib/aarch64-linux-gnu/nvidia"
        (root / libs.lstrip("/")).mkdir(parents=True)
        config["mounts"].append({"destination": libs, "type": "bind", "source": libs, "options": ["ro", "bind"]})
        meta["cdi"] = {"spec": "/etc/cdi/nvidia.yaml", "kind": "nvidia.com/gpu", "devices": ["all"], "device_nodes": 1,
                       "mounts": 1, "deferred_devices": [{"path": "/dev/nvhost-ctrl-gpu"}]}
    write(bundle / "edge-bundle.json", json.dumps(meta, indent=1))
    write(bundle / "config.json", json.dumps(config, indent=1))
    write(bundle / "rootfs/opt/edge/package/manifest.json",
          json.dumps({"name": "all-MiniLM-L6-v2", "package_sha256": PACKAGE_SHA,
                      "selftest": {"boot_budget_ms": budget_ms}}))
    write(bundle.parent / "edge-archive.json", json.dumps({
        "format": 1, "bundle_sha256": SHA, "engine": "onnxruntime",
        "compatible": {"arch": arch, "l4t": l4t, "devices": devices or []}}))
    current = root / "opt/edge/bundle/current"
    current.parent.mkdir(parents=True, exist_ok=True)
    current.symlink_to("../slots/a/bundle")
    (root / "run/edge").mkdir(parents=True, exist_ok=True)
    os.chmod(root / "run/edge", 0o750)
    state = {"format": 1, "live": "a", "previous": None,
             "slots": {"a": {"bundle_sha256": SHA, "package": "all-MiniLM-L6-v2", "engine": "onnxruntime"}},
             "trial": trial or {"status": "committed", "slot": "a", "tries": 3, "tries_left": 3,
                                "since": "2026-12-01T05:42:23Z", "reason": None},
             "history": []}
    write(root / "var/lib/edge/install.json", json.dumps(state))
    return bundle


def take_snapshot(root: Path, bundle: Path, **deps) -> Path:
    """A snapshot of the slot's bundle where edge-supervise looks for it, taken for this bundle."""
    snap = root / "var/cache/edge" / SHA / "snapshot"
    images = {"pages-1.img": 4096, "core-1.img": 100}
    for name, size in images.items():
        write(snap / "images" / name, b"\0" * size)
    record = {"format": 1, "taken": "2026-12-01T03:30:18+0000", "images": images, "image_bytes": sum(images.values()),
              "dependencies": {"bundle_sha256": SHA, "bundle_path": os.path.realpath(bundle),
                               "package_sha256": PACKAGE_SHA, "model_sha256": "27" * 32,
                               "tokenizer_sha256": "3d" * 32, **deps}}
    write(snap / "snapshot.json", json.dumps(record))
    return snap


def coldstart_record(path: Path, passed: bool = True, median_ms: float = 532.0) -> Path:
    verdict = (f"PASS: exec to first reply {median_ms:.0f} ms (median) within the budget of 1500 ms" if passed
               else f"FAIL: exec to first reply {median_ms:.0f} ms (median) over the budget of 1500 ms")
    return write(path, json.dumps({
        "tool": "edge-coldstart", "record_version": 1, "started_at": "2026-12-01T04:00:00+00:00",
        "config": {"mode": "bundle", "engine": "onnxruntime", "cache": "warm", "runs": 10},
        "package": {"lineage": {"package_sha256": PACKAGE_SHA}},
        "summary": {"runs": 10, "median_ms": median_ms, "budget_ms": 1500.0, "pass": passed, "verdict": verdict}}))


# ------------------------------------------------------------------ the command line


def parser() -> argparse.ArgumentParser:
    """``edge``'s parser with ``doctor`` as edge/cli.py wires it (its client options, then ours)."""
    ap = argparse.ArgumentParser(prog="edge")
    sub = ap.add_subparsers(dest="command", required=True)
    doctor.add_arguments(cli._client_parser(sub, "doctor", "check the device", timeout_s=5.0))
    return ap


def wired() -> bool:
    """Whether edge/cli.py has a ``doctor`` command yet."""
    sub = next(a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction))
    return "doctor" in sub.choices


def main(argv: list[str], host=None) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``edge doctor ARGV``; ``host`` replaces the machine's commands."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        if host is None and wired():
            rc = cli.main(["doctor", *argv])
        else:
            try:
                args = parser().parse_args(["doctor", *argv])
            except SystemExit as exc:
                return int(exc.code or 0), out.getvalue(), err.getvalue()
            address = None
            if args.connect:
                from edge.ipc.endpoint import normalize_address

                address = normalize_address(args.connect)
            rc = doctor.run(args, address, None, host=host)
    return rc, out.getvalue(), err.getvalue()


def report_of(root: Path, *argv: str, host=None, rc: int | None = None) -> dict:
    """``edge doctor --json --root ROOT ARGV``'s report, checked: its exit status, a fix exactly
    where one is due (WARN, FAIL), one line each, nothing on stderr."""
    code, out, err = main(["--json", "--root", str(root), *argv], host=host)
    report = json.loads(out)
    assert err == ""
    assert code == report["summary"]["exit_status"]
    if rc is not None:
        assert code == rc, report
    for c in report["checks"]:  # a WARN or FAIL says what to do; a PASS or N/A has nothing to fix
        assert (c["fix"] is not None) == (c["verdict"] in ("WARN", "FAIL")), c
        assert c["fix"] is None or "\n" not in c["fix"]
    return report


def context(root: Path, host, *argv: str, system: bool = True):
    """A context on ``root`` that takes itself for the running system (``system``; its commands:
    ``host``) or not."""
    args = parser().parse_args(["doctor", "--root", str(root), *argv])
    ctx = doctor.make_context(args, None, None, host=host)
    ctx.system_root = system
    return ctx


def one(ctx, name: str):
    return doctor._table()[name](ctx)


def checks(report: dict) -> dict[str, dict]:
    assert [c["name"] for c in report["checks"]] == list(doctor.CHECKS)
    return {c["name"]: c for c in report["checks"]}
