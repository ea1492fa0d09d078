"""The bundle's socket directory under real runc: whatever state an earlier run or a root
``edge serve`` left it in, ``edge-coldstart --bundle`` (edge/system/socket_dir.py through
``runtime_runs.prepare_socket_dir``) makes it the runtime's and the start passes; a directory it
must not take over is refused at once (exit 2, naming it); and a runtime that still cannot bind
says which directory, whose it is and how to fix it, not ``--bind``.

Each test works on a private copy of the cached bundle's config (its own socket directory in
tmp_path; the rootfs is the cached bundle's, read-only), so no other test's container shares it.
One CLI run (the worst case: root's directory with root's leftovers) pays the burn-in's
reference embedding; the other states start the bundle through ``run_bundle`` with the
package's stored selftest reference.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from bench.coldstart.launch import MIN_COSINE
from bench.coldstart.runtime_runs import bundle_contract, run_bundle
from support.bundles import GID, UID, private_bundle, runc_or_skip

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


@pytest.fixture
def bundle(ort_bundle, tmp_path) -> Path:
    """A private bundle whose socket directory is ``tmp_path/run`` (not made yet); its config names
    that directory in EDGE_BUNDLE_SOCKET_DIR, as edge-bundle build writes it for its own."""
    runc_or_skip()
    b = private_bundle(ort_bundle, tmp_path)
    config = json.loads((b / "config.json").read_text())
    env = [e for e in config["process"]["env"] if not e.startswith("EDGE_BUNDLE_SOCKET_DIR=")]
    config["process"]["env"] = env + [f"EDGE_BUNDLE_SOCKET_DIR={tmp_path / 'run'}"]
    (b / "config.json").write_text(json.dumps(config))
    return b


def _owner_mode(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def _root_leftovers(d: Path) -> None:
    """What `edge serve` run by hand as root leaves: a root 0755 directory, its stale socket, its lock 0600."""
    d.mkdir(parents=True, exist_ok=True)
    os.chown(d, 0, 0)
    os.chmod(d, 0o755)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(d / "edge.sock"))  # closed unlistened: stale
    os.close(os.open(d / "edge.sock.lock", os.O_CREAT | os.O_WRONLY, 0o600))


def _reference(bundle: Path) -> tuple[str, list[float]]:
    """The package's stored selftest text and embedding: a reference without sentence-transformers."""
    meta = bundle_contract(bundle)
    rootfs = Path(json.loads((bundle / "config.json").read_text())["root"]["path"])
    manifest = json.loads((rootfs / meta["package"]["path"].lstrip("/") / "manifest.json").read_text())
    return manifest["selftest"]["text"], manifest["selftest"]["embedding"]


def _coldstart(bundle: Path, out: Path, timeout: float = 240) -> tuple[subprocess.CompletedProcess, float]:
    cmd = [sys.executable, "-m", "bench.coldstart.cli", "--bundle", str(bundle), "--runs", "1", "--no-baseline",
           "--budget-ms", "1e9", "--json", str(out / "record.json"), "--chart", str(out / "chart.png")]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=out)
    return proc, time.monotonic() - t0


def test_the_bundle_starts_from_a_missing_and_a_left_over_socket_dir(bundle, tmp_path):
    run = tmp_path / "run"
    text, reference = _reference(bundle)
    assert not run.exists()
    first = run_bundle(bundle, tmp_path / "w1", text, reference)  # missing: created
    assert first.cosine >= MIN_COSINE and _owner_mode(run) == (UID, GID, 0o750)
    left = sorted(os.listdir(run))
    assert "edge.sock.lock" in left  # the runtime's own leftovers of that run
    second = run_bundle(bundle, tmp_path / "w2", text, reference)  # left over from an earlier run
    assert second.cosine >= MIN_COSINE and _owner_mode(run) == (UID, GID, 0o750)


def test_coldstart_passes_after_root_left_its_socket_dir(bundle, tmp_path):
    run = tmp_path / "run"
    _root_leftovers(run)
    proc, _ = _coldstart(bundle, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("PASS")
    assert _owner_mode(run) == (UID, GID, 0o750)
    assert _owner_mode(run / "edge.sock.lock")[0] == UID  # root's was removed; the runtime made its own


def test_coldstart_refuses_a_symlinked_or_world_writable_socket_dir_at_once(bundle, tmp_path):
    run = tmp_path / "run"
    target = tmp_path / "elsewhere"
    target.mkdir()
    os.chmod(target, 0o755)
    run.symlink_to(target)
    proc, seconds = _coldstart(bundle, tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert f"the socket directory {run} is a symlink to {target}" in proc.stderr, proc.stderr
    assert "burn-in" not in proc.stderr and seconds < 30  # before the reference embedding and any start
    assert _owner_mode(target) == (0, 0, 0o755)
    run.unlink()
    run.mkdir()
    os.chmod(run, 0o777)
    proc, _ = _coldstart(bundle, tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert f"the socket directory {run} is writable by others (mode 0777)" in proc.stderr, proc.stderr
    assert _owner_mode(run) == (0, 0, 0o777)


def test_config_names_the_host_socket_dir(ort_bundle):
    config = json.loads((ort_bundle / "config.json").read_text())
    meta = bundle_contract(ort_bundle)
    assert f"EDGE_BUNDLE_SOCKET_DIR={meta['socket_dir']}" in config["process"]["env"]


def test_bind_error_under_a_bundle_names_the_socket_dir_and_its_owner(bundle, tmp_path):
    """No starter prepared the directory: root's, 0755, with root's leftovers (the field report)."""
    runc = runc_or_skip()
    run = tmp_path / "run"
    _root_leftovers(run)
    cid = f"edge-test-bind-{uuid.uuid4().hex[:8]}"
    try:
        proc = subprocess.run([runc, "run", "--bundle", str(bundle), cid], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=120)
    finally:
        subprocess.run([runc, "delete", "--force", cid], capture_output=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out[-3000:]
    failed = next(json.loads(line) for line in proc.stdout.splitlines() if '"boot.failed"' in line)
    assert failed["stage"] == "bind"
    assert failed["setting"].startswith(
        f"the bundle's socket directory /run/edge (host: {run}) belongs to uid 0 gid 0, mode 0755, "
        f"and the runtime runs as uid {UID}: "), failed["setting"]
    assert f"chown {UID}:{GID} {run} && chmod 0750 {run}" in failed["setting"]
    assert "--bind" not in failed["setting"] and "--bind" not in proc.stderr
    assert f"(change: the bundle's socket directory /run/edge (host: {run})" in proc.stderr
    shutil.rmtree(run)
