"""The bundle under the real runc: READY over NOTIFY_SOCKET, embeddings through the mounted
socket equal to the plain process's, a read-only root, no capabilities, a loud failure when
a file is missing, and the supervisor's watchdog pings."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

import numpy as np
import pytest


from support.bundles import (UID, bundle_meta, plain_runtime, prepare_socket_dir, runc_or_skip,
                             start_container, stop_process)
from support.supervisor import supervisor_file

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Jetson appliances boot in under two seconds.",
         "日本語の文も埋め込みます。"]


def _embed_cli(address: str, texts: list[str]) -> np.ndarray:
    out = subprocess.run([sys.executable, "-m", "edge.cli", "embed", "--connect", address, "--timeout", "30", *texts],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    return np.asarray([json.loads(line)["embedding"] for line in out.stdout.splitlines()], dtype=np.float32)


def _exec_json(container, python: str, code: str) -> dict:
    """Run ``code`` with the bundle's python inside the running container; its one JSON line."""
    out = container.exec(python, "-c", code)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def container(ort_bundle, tmp_path_factory):
    runc_or_skip()
    prepare_socket_dir(bundle_meta(ort_bundle))
    c = start_container(ort_bundle, tmp_path_factory.mktemp("runc"))
    try:
        c.wait_ready()
        yield c
    finally:
        c.stop()


def test_ready_arrives_on_the_notify_socket(container):
    fields = [f for n in container.notices for f in n.split(b"\n")]
    assert b"READY=1" in fields
    assert "boot.ready" in container.output()


def test_embed_through_the_mounted_socket_matches_the_plain_process(container, ort_bundle, minilm_package, tmp_path):
    meta = bundle_meta(ort_bundle)
    sock = os.path.join(meta["socket_dir"], "edge.sock")
    assert meta["address"] == f"ipc://{sock}"
    st = os.stat(sock)
    assert stat.S_ISSOCK(st.st_mode) and st.st_uid == UID and stat.S_IMODE(st.st_mode) == 0o660
    in_bundle = _embed_cli(meta["address"], TEXTS)
    proc, address = plain_runtime(minilm_package, tmp_path, {})
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(address[len("ipc://"):]) and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "plain.log").read_text()
            time.sleep(0.1)
        plain = _embed_cli(address, TEXTS)
    finally:
        stop_process(proc)
    assert in_bundle.shape == plain.shape == (len(TEXTS), 384)
    assert np.abs(in_bundle - plain).max() <= 1e-4


def test_replies_name_the_bundle_they_came_from(container, ort_bundle):
    """The lineage carries the digest the builder computed, and edge-bundle verify recomputes it."""
    from edge.ipc.client import EdgeClient
    from image.bundle.digest import bundle_digest, config_digest_entry

    meta = bundle_meta(ort_bundle)
    config = json.loads((ort_bundle / "config.json").read_text())
    assert len(meta["bundle_sha256"]) == 64 and config_digest_entry(config) == meta["bundle_sha256"]
    assert bundle_digest(ort_bundle / "rootfs", config) == meta["bundle_sha256"]
    with EdgeClient(meta["address"], timeout_s=30) as client:
        result = client.embed(["which bundle answered?"])
        lineage = client.stats()["lineage"]
    assert result.meta["bundle_sha256"] == lineage["bundle_sha256"] == meta["bundle_sha256"]
    assert lineage["package_sha256"] == meta["package"]["package_sha256"] and lineage["edge_version"]


def test_a_reply_of_the_bundle_is_traced_from_the_host(container, ort_bundle):
    """The container writes its request journal in the host's state directory (a bind of its
    own), so `edge trace ID` on the host finds a reply of the bundle, with the bundle's lineage."""
    from edge.ipc.client import EdgeClient

    meta = bundle_meta(ort_bundle)
    with EdgeClient(meta["address"], timeout_s=30) as client:
        result = client.embed(["where is this reply recorded?", "and this one"])
    trace_id = result.meta["trace_id"]
    cmd = [sys.executable, "-m", "edge.cli", "trace", trace_id, "--state-dir", meta["state_dir"], "--json"]
    deadline = time.monotonic() + 10  # the journal's writer flushes about every second
    while True:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        if r.returncode != 1 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.returncode == 0, (r.stdout, r.stderr)
    entry = json.loads(r.stdout)
    text = json.dumps(entry)
    assert trace_id in text and meta["bundle_sha256"] in text and meta["package"]["package_sha256"] in text, entry


def test_root_is_read_only_and_no_capabilities_inside(container, ort_bundle):
    python = bundle_meta(ort_bundle)["python"]
    check = (
        "import os, errno, json\n"
        "res = {}\n"
        "for p in ('/probe', '/opt/edge/package/probe', os.path.dirname(os.__file__) + '/probe'):\n"
        "    try:\n"
        "        open(p, 'w').close(); res[p] = 'written'\n"
        "    except OSError as e:\n"
        "        res[p] = errno.errorcode[e.errno]\n"
        "status = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)\n"
        "caps = {k: int(status[k], 16) for k in ('CapEff', 'CapPrm', 'CapBnd', 'CapInh', 'CapAmb')}\n"
        "print(json.dumps({'writes': res, 'caps': caps, 'uid': os.getuid(), 'nnp': status['NoNewPrivs'].strip(),\n"
        "                  'seccomp': status['Seccomp'].strip(), 'rdonly': bool(os.statvfs('/').f_flag & os.ST_RDONLY),\n"
        "                  'tmp_writable': os.access('/tmp', os.W_OK),\n"
        "                  'ort_telemetry': sorted(os.listdir('/tmp/.cache')) if os.path.isdir('/tmp/.cache') else [],\n"
        "                  'tmp_files': sorted(os.listdir('/tmp'))}))\n"
    )
    r = _exec_json(container, python, check)
    assert set(r["writes"].values()) == {"EROFS"}, r["writes"]
    assert r["caps"] == {"CapEff": 0, "CapPrm": 0, "CapBnd": 0, "CapInh": 0, "CapAmb": 0}
    assert r["uid"] == UID and r["nnp"] == "1" and r["seccomp"] == "2" and r["rdonly"]
    # ONNX Runtime's telemetry is off (edge/engines/ort_capi.py): no device id, no event cache
    # (its SQLite database, /tmp/.cache/Microsoft), no session file (/tmp/.ses) in the serving
    # container's tmpfs HOME, which stays writable.
    assert r["tmp_writable"] and r["ort_telemetry"] == [] and ".ses" not in r["tmp_files"], r


def test_seccomp_refuses_what_is_not_listed(container, ort_bundle):
    python = bundle_meta(ort_bundle)["python"]
    # unshare(CLONE_NEWUSER) would work unprivileged on this kernel; the profile refuses it.
    code = "import ctypes; libc = ctypes.CDLL('libc.so.6', use_errno=True); " \
           "print(libc.unshare(0x10000000), ctypes.get_errno())"
    out = container.exec(python, "-c", code)
    assert out.returncode == 0, out.stderr
    ret, err = out.stdout.split()
    assert ret == "-1" and err == "1"  # EPERM


def test_only_the_runtimes_socket_families_and_its_own_cgroup(container, ort_bundle):
    """Inside the running container: AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK open; AF_VSOCK,
    AF_PACKET and AF_BLUETOOTH are refused; /proc/self/cgroup shows only the container's own root."""
    python = bundle_meta(ort_bundle)["python"]
    code = (
        "import json, socket, errno\n"
        "res = {}\n"
        "for name, fam, kind in [('unix', 1, 1), ('inet', 2, 1), ('inet6', 10, 1), ('netlink', 16, 3),\n"
        "                        ('vsock', 40, 1), ('packet', 17, 3), ('bluetooth', 31, 1)]:\n"
        "    try:\n"
        "        socket.socket(fam, kind).close(); res[name] = 'ok'\n"
        "    except OSError as e:\n"
        "        res[name] = errno.errorcode.get(e.errno, str(e.errno))\n"
        "res['cgroups'] = [line.rsplit(':', 1)[1] for line in open('/proc/self/cgroup').read().split()]\n"
        "print(json.dumps(res))\n"
    )
    r = _exec_json(container, python, code)
    assert {k: r[k] for k in ("unix", "inet", "inet6", "netlink")} == dict.fromkeys(("unix", "inet", "inet6", "netlink"), "ok")
    assert {k: r[k] for k in ("vsock", "packet", "bluetooth")} == dict.fromkeys(("vsock", "packet", "bluetooth"), "EPERM")
    assert set(r["cgroups"]) == {"/"}, r["cgroups"]  # a cgroup namespace: the host's hierarchy is not visible


_LIMITS_PROBE = (
    "import json, os, resource\n"
    "def read(p):\n"
    "    try:\n"
    "        return open(p).read().strip()\n"
    "    except OSError:\n"
    "        return None\n"
    "v2 = os.path.exists('/sys/fs/cgroup/cgroup.controllers')\n"
    "if v2:  # the unified hierarchy (JetPack 6): one directory, the container's cgroup at its root\n"
    "    res = {'memory': read('/sys/fs/cgroup/memory.max'), 'swap': read('/sys/fs/cgroup/memory.swap.max'),\n"
    "           'pids': read('/sys/fs/cgroup/pids.max')}\n"
    "else:  # cgroup v1 (this build host): one directory per controller\n"
    "    res = {'memory': read('/sys/fs/cgroup/memory/memory.limit_in_bytes'),\n"
    "           'memsw': read('/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes'),\n"
    "           'pids': read('/sys/fs/cgroup/pids/pids.max')}\n"
    "res['v2'] = v2\n"
    "res['nofile'] = resource.getrlimit(resource.RLIMIT_NOFILE)  # this probe's, from runc exec\n"
    "line = next(l for l in open('/proc/1/limits') if l.startswith('Max open files'))\n"
    "res['runtime_nofile'] = [int(x) for x in line.split()[3:5]]  # the runtime's (pid 1): soft, hard\n"
    "print(json.dumps(res))\n"
)


def _run_nofile(container) -> int:
    config = json.loads((container.bundle / "config.json").read_text())
    (r,) = [r for r in config["process"]["rlimits"] if r["type"] == "RLIMIT_NOFILE"]
    return r["hard"]


def test_memory_and_pids_limits_are_in_effect_inside(container, ort_bundle):
    """The container's cgroup has the limits config.json derived from the package: memory
    without swap, and pids. Read from inside (a cgroup namespace: its own cgroup is the root)."""
    limits = bundle_meta(ort_bundle)["limits"]
    resources = json.loads((ort_bundle / "config.json").read_text())["linux"]["resources"]
    assert resources["memory"] == {"limit": limits["memory_bytes"], "swap": limits["memory_bytes"]}
    assert resources["pids"] == {"limit": limits["pids"]} == {"limit": 256}
    r = _exec_json(container, bundle_meta(ort_bundle)["python"], _LIMITS_PROBE)
    assert r["memory"] == str(limits["memory_bytes"]), r
    assert r["pids"] == "256", r
    if r["v2"]:
        assert r["swap"] == "0", r  # memory.swap.max: swap = limit in the spec, none on top
    elif r["memsw"] is not None:  # v1 with swap accounting: memory+swap = memory
        assert r["memsw"] == str(limits["memory_bytes"]), r


def test_open_files_limit_is_in_effect_inside(container, ort_bundle):
    """RLIMIT_NOFILE soft = hard = 65536 (20,000 held connections fit under the server's cap)."""
    config = json.loads((ort_bundle / "config.json").read_text())
    assert config["process"]["rlimits"] == [{"type": "RLIMIT_NOFILE", "hard": 65536, "soft": 65536}]
    r = _exec_json(container, bundle_meta(ort_bundle)["python"], _LIMITS_PROBE)
    ran = _run_nofile(container)
    assert r["runtime_nofile"] == [ran, ran] and r["nofile"] == [ran, ran], r  # what runc was given, the runtime got
    if ran != 65536:
        pytest.skip(f"this host's root lacks CAP_SYS_RESOURCE and its hard RLIMIT_NOFILE is {ran}, so runc "
                    f"cannot grant 65536: the container ran with {ran} (and got it); config.json says 65536")


def test_runc_default_masks_and_the_tpm_are_masked(ort_bundle):
    masked = set(json.loads((ort_bundle / "config.json").read_text())["linux"]["maskedPaths"])
    assert {"/sys/devices/virtual/powercap", "/sys/firmware", "/proc/kcore", "/sys/class/tpm",
            "/sys/kernel/security"} <= masked


def test_host_probe_speaks_zmtp_to_the_runtime(container, ort_bundle):
    meta = bundle_meta(ort_bundle)
    out = subprocess.run([sys.executable, str(supervisor_file()), "--probe", meta["address"]],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout) == {"ready": True, "detail": "ready"}


def test_a_missing_file_fails_loudly_naming_it(ort_bundle, tmp_path):
    from image.build_bundle import FILES_NAME, verify_bundle

    runc_or_skip()
    broken = tmp_path / "broken"
    # Hard links: a full copy of the rootfs for the price of its directories.
    subprocess.run(["cp", "-al", str(ort_bundle), str(broken)], check=True)
    listed = [line.split("\t")[0] for line in (broken / FILES_NAME).read_text().splitlines()]
    victim = next(p for p in listed if os.path.basename(p).startswith("libzmq"))  # dlopened by zmq's extension
    (broken / "rootfs" / victim.lstrip("/")).unlink()
    problems = verify_bundle(broken)
    assert problems[0] == f"missing: {victim}" and problems[1].startswith("digest differs") and len(problems) == 2
    prepare_socket_dir(bundle_meta(broken))
    c = start_container(broken, tmp_path / "run", prefix="edge-broken")
    try:
        deadline = time.monotonic() + 90
        while c.proc.poll() is None and time.monotonic() < deadline and "Error" not in c.output():
            time.sleep(0.2)
        time.sleep(1.0)  # let the traceback reach the log
        with pytest.raises(AssertionError):
            c.wait_ready(deadline_s=2)
    finally:
        code = c.stop()
    assert code not in (0, None)
    assert os.path.basename(victim) in c.output(), c.output()
