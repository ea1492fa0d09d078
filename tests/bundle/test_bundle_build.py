"""The bundle's files, config.json and metadata; CDI merge; the arch check; the systemd unit."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


from support.bundles import FIXTURES, GID, REPO, UID, bundle_meta
from image.bundle import cdi, oci_config, seccomp
from image.bundle.layout import PYTHON_HOME, SITE
from image.bundle.rootfs import Rootfs, elf_machine

ORIN = FIXTURES / "cdi-orin.yaml"
_MIB, _GIB = 1 << 20, 1 << 30


def _config(bundle: Path) -> dict:
    return json.loads((bundle / "config.json").read_text())


def test_config_is_locked_down(ort_bundle):
    c = _config(ort_bundle)
    assert c["ociVersion"] == "1.0.2-dev"
    assert c["root"] == {"path": "rootfs", "readonly": True}
    p = c["process"]
    assert p["user"]["uid"] == UID != 0 and p["user"]["gid"] == GID
    assert p["noNewPrivileges"] is True
    assert all(v == [] for v in p["capabilities"].values()) and len(p["capabilities"]) == 5
    env = dict(e.split("=", 1) for e in p["env"])
    assert env["HOME"] == "/tmp" and env["PYTHONDONTWRITEBYTECODE"] == "1" and env["OPENBLAS_NUM_THREADS"] == "1"
    assert "LD_PRELOAD" not in env or "jemalloc" in env["LD_PRELOAD"]
    assert p["args"][1:5] == ["-S", "-m", "edge.boot", "--engine"] and p["args"][-1] == "ipc:///run/edge/edge.sock"
    # The runtime starts without site, from fixed paths (image/bundle/layout.py), never the build host's.
    assert env["PYTHONPATH"] == SITE and env["PYTHONHOME"] == PYTHON_HOME and p["args"][0].startswith(PYTHON_HOME)
    mounts = {m["destination"]: m for m in c["mounts"]}
    assert mounts["/tmp"]["type"] == "tmpfs" and "noexec" in mounts["/tmp"]["options"]
    meta = bundle_meta(ort_bundle)
    assert mounts["/run/edge"]["source"] == meta["socket_dir"] and "rw" in mounts["/run/edge"]["options"]
    assert {"type": "network"} in c["linux"]["namespaces"]  # ipc only: no host network
    assert c["linux"]["seccomp"]["defaultAction"] == "SCMP_ACT_ERRNO"
    assert c["linux"]["resources"]["devices"][0] == {"allow": False, "access": "rwm"}
    limits = meta["limits"]
    assert c["linux"]["resources"]["memory"] == {"limit": limits["memory_bytes"], "swap": limits["memory_bytes"]}
    assert c["linux"]["resources"]["pids"] == {"limit": 256}
    assert p["rlimits"] == [{"type": "RLIMIT_NOFILE", "hard": 65536, "soft": 65536}]
    assert os.stat(ort_bundle / "rootfs" / "tmp").st_mode & 0o1777 == 0o1777  # runc copies it onto the tmpfs


def test_tcp_shares_the_host_network_only_then():
    kw = dict(args=["python"], env={}, uid=1, gid=1, socket_dir_host="/run/edge", arch="x86_64", memory_bytes=1 << 30)
    assert {"type": "network"} in oci_config.runtime_config(**kw)["linux"]["namespaces"]
    assert {"type": "network"} not in oci_config.runtime_config(**kw, share_host_network=True)["linux"]["namespaces"]


def test_memory_limit_is_the_mapped_files_plus_the_headroom_rounded_up_to_a_mib():
    headroom = 1536 * _MIB  # 512 MiB anonymous + 128 MiB tmpfs + 20,000 connections x 26 KiB, and margin
    assert oci_config.MEMORY_HEADROOM == headroom
    assert oci_config.memory_limit(0) == headroom
    assert oci_config.memory_limit(1) == headroom + _MIB  # rounded up, never down
    assert oci_config.memory_limit(_MIB) == headroom + _MIB  # a whole MiB stays as it is
    assert oci_config.memory_limit(_MIB + 1) == headroom + 2 * _MIB
    # The MiniLM onnxruntime bundle on this machine (docs/bundle.md): package (the engine's files) + runtime files.
    assert oci_config.memory_limit(181_525_580 + 126_955_335) == 1831 * _MIB
    assert oci_config.memory_limit(271_820_448 + 126_452_233) == 1916 * _MIB  # with every engine's files
    with pytest.raises(ValueError):
        oci_config.memory_limit(-1)


def test_resource_limits_and_the_units_drop_in_derive_from_the_sizes():
    from image.bundle.limits import UNIT_MEMORY_OVERHEAD, resource_limits, unit_dropin

    limits = resource_limits(300 * _MIB + 5, 100 * _MIB)
    assert limits["memory_bytes"] == 1937 * _MIB  # 300 MiB + 5 B + 100 MiB + 1.5 GiB, rounded up
    assert limits["swap_bytes"] == 0 and limits["pids"] == 256 and limits["nofile"] == 65536
    assert limits["memory_derivation"] == {"package_bytes": 300 * _MIB + 5, "runtime_bytes": 100 * _MIB,
                                           "headroom_bytes": 1536 * _MIB, "rounded_to": "MiB"}
    assert limits["unit_memory_max"] == 1937 * _MIB + UNIT_MEMORY_OVERHEAD == 2065 * _MIB
    assert limits["unit_tasks_max"] == 320
    text = unit_dropin(limits)
    assert text.endswith("[Service]\nMemoryMax=2065M\nTasksMax=320\n")
    config = oci_config.runtime_config(args=["python"], env={}, uid=1, gid=1, socket_dir_host="/s", arch="x86_64",
                                       memory_bytes=limits["memory_bytes"], pids=limits["pids"])
    assert config["linux"]["resources"]["memory"] == {"limit": 1937 * _MIB, "swap": 1937 * _MIB}
    assert config["linux"]["resources"]["pids"] == {"limit": 256}
    assert config["process"]["rlimits"] == [{"type": "RLIMIT_NOFILE", "hard": 65536, "soft": 65536}]


def test_bundle_records_its_limits_and_writes_the_units_drop_in(ort_bundle):
    from image.bundle.limits import UNIT_DROPIN

    meta = bundle_meta(ort_bundle)
    limits, sizes = meta["limits"], meta["sizes"]
    assert limits["memory_derivation"]["package_bytes"] == sizes["package_bytes"] == meta["package"]["bytes"]
    assert limits["memory_derivation"]["runtime_bytes"] == sizes["runtime_bytes"]
    assert limits["memory_bytes"] == oci_config.memory_limit(sizes["package_bytes"] + sizes["runtime_bytes"])
    assert limits["memory_bytes"] % _MIB == 0 and limits["unit_dropin"] == UNIT_DROPIN
    dropin = (ort_bundle / UNIT_DROPIN).read_text()
    assert f"MemoryMax={limits['unit_memory_max'] // _MIB}M\n" in dropin
    assert f"TasksMax={limits['unit_tasks_max']}\n" in dropin
    # The static unit covers this (the default) bundle, as its comment says.
    unit = (REPO / "systemd" / "edge.service").read_text()
    assert "\nMemoryMax=3G\n" in unit and "\nTasksMax=512\n" in unit
    assert limits["unit_memory_max"] <= 3 * _GIB - 512 * _MIB and limits["unit_tasks_max"] <= 512  # with margin


def test_metadata_tells_clients_where_to_connect(ort_bundle, minilm_package):
    meta = bundle_meta(ort_bundle)
    assert meta["address"] == f"ipc://{meta['socket_dir']}/edge.sock"
    assert meta["arch"] == os.uname().machine and meta["engine"] == "onnxruntime"
    manifest = json.loads((minilm_package / "manifest.json").read_text())
    assert meta["package"]["package_sha256"] == manifest["package_sha256"]
    assert (ort_bundle / "rootfs" / "opt/edge/package/manifest.json").read_bytes() == \
        (minilm_package / "manifest.json").read_bytes()
    s = meta["sizes"]
    assert 0 < s["runtime_bytes"] < s["source_env_bytes"] and s["runtime_files"] < s["source_env_files"]
    # The container names its prefix (PYTHONHOME): no pyvenv.cfg, and nothing at the venv's path.
    assert not list((ort_bundle / "rootfs").rglob("pyvenv.cfg"))
    assert not (ort_bundle / "rootfs" / sys.prefix.lstrip("/")).exists()


def test_rootfs_holds_the_traced_runtime_and_nothing_else(ort_bundle):
    from image.build_bundle import verify_bundle

    meta = bundle_meta(ort_bundle)
    root = ort_bundle / "rootfs"
    site = Path(SITE)  # image/bundle/layout.py: the device wheel's install and the dependencies
    present = {p.name for p in (root / str(site).lstrip("/")).iterdir()}
    for needed in ("edge", "zmq", "numpy", "msgpack", "flatbuffers", "onnxruntime"):
        assert needed in present, needed
    for unneeded in ("torch", "sentence_transformers", "transformers", "pytest", "onnx", "pip", "tokenizers",
                     "pydantic"):
        assert unneeded not in present, unneeded
    ort_dir = root / str(site).lstrip("/") / "onnxruntime" / "capi"
    assert any(p.name.startswith("libonnxruntime.so") for p in ort_dir.iterdir())  # via ctypes, seen in maps
    assert not list(ort_dir.glob("onnxruntime_pybind11_state*"))  # the Python binding is never imported
    assert (root / "lib64" / "ld-linux-x86-64.so.2").is_symlink() or os.uname().machine != "x86_64"
    assert meta["trace"]["modules"] > 100 and meta["trace"]["mapped_files"] > 10
    assert verify_bundle(ort_bundle) == []
    # Every traced library is of the target architecture.
    machines = {elf_machine(str(root / line.split("\t")[0].lstrip("/")))
                for line in (ort_bundle / "rootfs.files").read_text().splitlines()}
    assert machines - {None} == {meta["arch"]}


def test_traced_syscalls_fit_the_seccomp_profile(ort_bundle):
    traced = set(bundle_meta(ort_bundle)["seccomp"]["traced_syscalls"])
    if not traced:
        pytest.skip("the bundle was traced without strace")
    assert {"openat", "mmap", "futex"} <= traced
    assert seccomp.check_traced(traced) == []
    assert seccomp.check_traced({"mount", "ptrace", "bpf"}) == ["bpf", "mount", "ptrace"]


def test_verify_notices_a_changed_file_through_the_digest(ort_bundle, tmp_path):
    """Same size, other bytes: only the digest can tell. The copy is changed, never the shared bundle."""
    import shutil

    from image.build_bundle import verify_bundle

    copy = tmp_path / "bundle"
    shutil.copytree(ort_bundle, copy, symlinks=True)
    assert verify_bundle(copy) == []
    target = copy / "rootfs" / "etc" / "passwd"
    data = bytearray(target.read_bytes())
    data[0] ^= 0x01
    target.write_bytes(bytes(data))
    problems = verify_bundle(copy)
    assert len(problems) == 1 and problems[0].startswith("digest differs"), problems


def test_arch_mismatch_is_refused(minilm_package, tmp_path):
    other = "aarch64" if os.uname().machine != "aarch64" else "x86_64"
    out = subprocess.run([sys.executable, "-m", "image.build_bundle", "build", "--out", str(tmp_path / "b"),
                          "--package", str(minilm_package), "--arch", other, "--quiet"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert f"the target is {other}" in out.stderr and os.uname().machine in out.stderr
    assert not (tmp_path / "b").exists()


def test_cdi_yaml_spec_merges_nodes_mounts_env_hooks_and_gids():
    edits = cdi.select_edits(cdi.load_spec(ORIN))
    assert edits.devices == ["all"] and edits.kind == "nvidia.com/gpu"
    paths = [n["path"] for n in edits.device_nodes]
    assert "/dev/nvmap" in paths and "/dev/nvgpu/igpu0/ctrl" in paths and len(paths) == len(set(paths))
    config = oci_config.runtime_config(args=["python"], env={"HOME": "/tmp", "NVIDIA_VISIBLE_DEVICES": "x"}, uid=UID,
                                       gid=GID, socket_dir_host="/run/edge", arch="aarch64", memory_bytes=_GIB)
    deferred = cdi.merge(config, edits)
    # Not on this host: deferred to the device, where edge-supervise reads major/minor.
    assert {n["path"] for n in deferred} == set(paths)
    dests = {m["destination"]: m for m in config["mounts"]}
    lib = "/usr/lib/aarch64-linux-gnu/nvidia/libcuda.so.1.1"
    assert dests[lib]["source"] == lib and dests[lib]["type"] == "bind" and "ro" in dests[lib]["options"]
    env = dict(e.split("=", 1) for e in config["process"]["env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void" and env["HOME"] == "/tmp"
    assert config["process"]["user"]["additionalGids"] == [44]
    hooks = config["hooks"]["createContainer"]
    assert [h["args"][2] for h in hooks] == ["create-symlinks", "update-ldcache"]
    assert "/usr/lib/aarch64-linux-gnu/nvidia/libnvos.so" in cdi.mount_paths(edits)
    assert config["linux"]["seccomp"]["architectures"][0] == "SCMP_ARCH_AARCH64"


def test_cdi_json_nodes_present_on_the_host_get_major_minor_at_build(tmp_path):
    spec = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [{"name": "0", "containerEdits": {
        "deviceNodes": [{"path": "/dev/nvmap", "hostPath": "/dev/null"}, {"path": "/dev/nvhost-gpu"}]}}]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    edits = cdi.select_edits(cdi.load_spec(tmp_path / "spec.json"), ["0"])
    config = oci_config.runtime_config(args=["python"], env={}, uid=UID, gid=GID, socket_dir_host="/s", arch="x86_64",
                                       memory_bytes=_GIB)
    deferred = cdi.merge(config, edits)
    assert [n["path"] for n in deferred] == ["/dev/nvhost-gpu"]
    (dev,) = config["linux"]["devices"]
    assert (dev["path"], dev["type"], dev["major"], dev["minor"]) == ("/dev/nvmap", "c", 1, 3)
    assert {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"} in config["linux"]["resources"]["devices"]
    with pytest.raises(cdi.CdiError, match="no device 7"):
        cdi.select_edits(cdi.load_spec(tmp_path / "spec.json"), ["7"])


def test_cdi_mountpoints_are_made_in_the_rootfs(tmp_path):
    config = oci_config.runtime_config(args=["python"], env={}, uid=UID, gid=GID, socket_dir_host="/s", arch="aarch64",
                                       memory_bytes=_GIB)
    cdi.merge(config, cdi.select_edits(cdi.load_spec(ORIN)))
    rootfs = Rootfs(tmp_path / "rootfs")
    rootfs.make_mountpoints(config["mounts"])
    assert (tmp_path / "rootfs/usr/lib/aarch64-linux-gnu/nvidia/libcuda.so.1.1").is_file()
    assert (tmp_path / "rootfs/usr/lib/firmware/ga10b").is_dir()


def test_supervisor_resolves_deferred_devices_at_start(tmp_path):
    from edge.supervise import bundle_start as sup

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    config = oci_config.runtime_config(args=["python"], env={}, uid=UID, gid=GID, socket_dir_host="/s", arch="x86_64",
                                       memory_bytes=_GIB)
    (bundle / "config.json").write_text(json.dumps(config))
    meta = {"cdi": {"deferred_devices": [{"path": "/dev/nvmap", "hostPath": "/dev/null"}]}}
    work = tmp_path / "work"
    work.mkdir()
    run_dir = sup.runtime_bundle(str(bundle), meta, str(work))
    assert run_dir == str(work)
    written = json.loads((work / "config.json").read_text())
    assert written["root"]["path"] == str(bundle / "rootfs")
    assert {"path": "/dev/nvmap", "type": "c", "major": 1, "minor": 3} .items() <= written["linux"]["devices"][0].items()
    assert sup.runtime_bundle(str(bundle), {"cdi": None}, str(work)) == str(bundle)
    meta["cdi"]["deferred_devices"] = [{"path": "/dev/nvmap", "hostPath": "/dev/no-such-gpu"}]
    with pytest.raises(FileNotFoundError, match="/dev/no-such-gpu"):
        sup.runtime_bundle(str(bundle), meta, str(work))


def test_zmtp_frames_round_trip_sizes():
    from edge.supervise import probe as sup

    assert sup._zmtp_frame(b"ab") == b"\x00\x02ab"
    assert sup._zmtp_frame(b"ab", more=True) == b"\x01\x02ab"
    long = sup._zmtp_frame(b"x" * 300)
    assert long[0] == 0x02 and int.from_bytes(long[1:9], "big") == 300 and len(long) == 309
    ok, detail = sup.probe("ipc:///nonexistent/edge.sock", 0.5)
    assert not ok and "FileNotFoundError" in detail


def test_systemd_units_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    units = sorted((REPO / "systemd").glob("*.service")) + sorted((REPO / "systemd").glob("*.timer"))
    assert units, "no unit files in systemd/"
    # Verified side by side (edge-trial.service binds to edge.service). The trial's units run
    # /usr/local/bin/edge-trial, where `pip install` puts it on a device; here it is this venv's
    # (verify checks that an ExecStart= command exists).
    trial = str(Path(sys.executable).with_name("edge-trial"))
    edge = str(Path(sys.executable).with_name("edge"))
    for unit in units:
        (tmp_path / unit.name).write_text(unit.read_text().replace("/usr/local/bin/edge-trial", trial)
                                          .replace("/usr/local/bin/edge gateway", edge + " gateway"))
    for unit in sorted(tmp_path.iterdir()):
        out = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and not out.stderr.strip(), f"{unit.name}: {out.stderr}"
    text = (REPO / "systemd" / "edge.service").read_text()
    for line in ("Type=notify", "NotifyAccess=main", "WatchdogSec=", "Restart=on-failure", "StartLimitBurst=",
                 "ExecStopPost=", "MemoryMax=", "TasksMax=", "ExecStartPre=-/usr/local/bin/edge-trial pre-start",
                 "Wants=edge-trial.service", "OnFailure=edge-trial-failed.service"):
        assert line in text, line
    gateway = (REPO / "systemd" / "edge-gateway.service").read_text()
    for line in ("Type=notify", "NotifyAccess=main", "After=edge.service", "Wants=edge.service",
                 "ExecStart=/usr/local/bin/edge gateway", "Restart=on-failure", "MemoryMax="):
        assert line in gateway, line


def test_unit_with_the_bundles_drop_in_verifies(ort_bundle, tmp_path):
    """The drop-in the build writes is a valid override of edge.service (read from edge.service.d/ beside it)."""
    from image.bundle.limits import UNIT_DROPIN

    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    shutil.copyfile(REPO / "systemd" / "edge.service", tmp_path / "edge.service")
    (tmp_path / "edge.service.d").mkdir()
    shutil.copyfile(ort_bundle / UNIT_DROPIN, tmp_path / UNIT_DROPIN)
    (tmp_path / "edge.service.d" / "probe.conf").write_text("[Service]\nNoSuchKey=1\n")  # shows it is read
    out = subprocess.run([analyze, "verify", str(tmp_path / "edge.service")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "NoSuchKey" in out.stderr, out.stderr
    (tmp_path / "edge.service.d" / "probe.conf").unlink()
    out = subprocess.run([analyze, "verify", str(tmp_path / "edge.service")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr
