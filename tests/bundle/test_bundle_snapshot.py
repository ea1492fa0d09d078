"""Snapshots of the MiniLM bundle, for real: ``runc checkpoint`` at the runtime's snapshot
point, ``runc restore`` with CRIU 4.x (image/bundle/snapshot.py, edge/runtime/snapshot.py).

Each test works on a private copy of the bundle's config (its own socket directory, the
open-files limit this host can grant) so that the cached bundle and other tests' containers
are never touched; the rootfs is the cached bundle's, read-only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from support.bundles import private_bundle, runc_or_skip
from edge.ipc.client import EdgeClient
from image.bundle import snapshot as S
from edge.system.snapshot_rules import USERNS_SIZE

TEXTS = ["the conveyor belt stopped twice during the night shift", "restore me"]


def _runc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runc", *args], capture_output=True, text=True, timeout=60)


def _embed(address: str, socket_file: Path, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while not socket_file.exists():  # a client that connects first waits a reconnect interval (100 ms)
        assert time.monotonic() < deadline, f"no {socket_file} within {timeout_s} s"
        time.sleep(0.005)
    with EdgeClient(address, timeout_s=timeout_s) as c:
        return c.embed(TEXTS)


def _stop(cid: str) -> None:
    _runc("kill", cid, "TERM")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        state = _runc("state", cid)
        if state.returncode != 0 or '"stopped"' in state.stdout:
            break
        time.sleep(0.05)
    _runc("delete", "--force", cid)


def _drain(proc: subprocess.Popen) -> None:
    threading.Thread(target=proc.stdout.read, daemon=True).start()


@pytest.fixture(scope="module")
def snapped(ort_bundle):
    runc_or_skip()
    work = Path(tempfile.mkdtemp(prefix="edge-snap-", dir="/tmp"))  # pytest's basetemp is 0700: see below
    os.chmod(work, 0o711)
    try:
        bundle = private_bundle(ort_bundle, work)
        t0 = time.monotonic()
        record = S.take_snapshot(bundle)
        yield bundle, work / "run", record, time.monotonic() - t0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_a_snapshot_needs_directories_others_can_search(ort_bundle, tmp_path):
    """The restore runs as an unprivileged host uid (the user namespace): pytest's 0700 basetemp
    is the case in point. Refused before any container starts, naming the directory."""
    runc_or_skip()
    bundle = private_bundle(ort_bundle, tmp_path)
    with pytest.raises(S.SnapshotError, match="not searchable by others"):
        S.take_snapshot(bundle)


def test_a_restored_bundle_answers_as_a_fresh_one_does(snapped):
    bundle, run, record, took_s = snapped
    address, sock = f"ipc://{run}/edge.sock", run / "edge.sock"
    assert record["image_bytes"] > 0 and record["dependencies"] == S.dependencies(bundle)
    replies, timelines = [], []
    for i in range(2):
        cid = f"edge-test-restore-{os.getpid()}-{i}"
        proc = S.restore(bundle, cid)
        _drain(proc)
        try:
            replies.append(_embed(address, sock))
            timelines.append(json.loads((run / "timeline.json").read_text()))
        finally:
            _stop(cid)
    cid = f"edge-test-fresh-{os.getpid()}"
    fresh = subprocess.Popen(["runc", "run", "-d", "--bundle", str(bundle), cid], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert fresh.wait(60) == 0
        _drain(fresh)
        reference = _embed(address, sock)
        fresh_timeline = json.loads((run / "timeline.json").read_text())
    finally:
        _stop(cid)
    # parity: the restored runtime computes what a fresh boot does. The two restores run one image:
    # bit for bit the same. The snapshot packed ONNX Runtime's weights (--ort-prepacking auto) and
    # the fresh boot did not: its sums run in another order, so the last bits may differ (1.2e-7 seen).
    np.testing.assert_array_equal(replies[0].embeddings, replies[1].embeddings)
    for r in replies:
        np.testing.assert_allclose(r.embeddings, reference.embeddings, rtol=0, atol=1e-6)
    snapped_load = next(s for s in timelines[0]["snapshot"]["stages"] if s["stage"] == "load_engine")
    fresh_load = next(s for s in fresh_timeline["stages"] if s["stage"] == "load_engine")
    assert snapped_load["prepacking"] is True and fresh_load["prepacking"] is False
    assert replies[0].meta["trace_id"] != replies[1].meta["trace_id"]  # reseeded: restores diverge
    assert [t["start"] for t in timelines] == ["restored", "restored"] and fresh_timeline["start"] == "fresh"
    stages = [s["stage"] for s in timelines[0]["stages"]]
    assert stages[:2] == ["restore", "restore_hook"] and "bind" in stages and "warm_buckets" not in stages
    assert "warm_buckets" in [s["stage"] for s in timelines[0]["snapshot"]["stages"]]


def test_check_refuses_a_snapshot_of_another_bundle_and_a_truncated_image(snapped, tmp_path):
    bundle, _, _, _ = snapped
    assert S.check_snapshot(bundle) is None
    copy = tmp_path / "bundle"  # check_snapshot reads files only: pytest's basetemp will do
    shutil.copytree(bundle, copy)
    shutil.copytree(S.snapshot_dir(bundle), S.snapshot_dir(copy))
    why = S.check_snapshot(copy)  # its config.json names the bundle's paths, not the copy's
    assert why == f"taken for another bundle_path: {str(bundle.resolve())!r} -> {str(copy.resolve())!r}", why
    record = json.loads((S.snapshot_dir(copy) / "snapshot.json").read_text())
    record["dependencies"]["bundle_path"] = str(copy.resolve())  # as if taken there
    (S.snapshot_dir(copy) / "snapshot.json").write_text(json.dumps(record))
    meta = json.loads((copy / "edge-bundle.json").read_text())
    meta["bundle_sha256"] = "0" * 64  # the bundle was rebuilt since
    (copy / "edge-bundle.json").write_text(json.dumps(meta))
    why = S.check_snapshot(copy)
    assert why and why.startswith("taken for another bundle_sha256"), why
    (copy / "edge-bundle.json").write_text((bundle / "edge-bundle.json").read_text())
    assert S.check_snapshot(copy) is None
    biggest = max((S.snapshot_dir(copy) / "images").iterdir(), key=lambda p: p.stat().st_size)
    with open(biggest, "r+b") as f:
        f.truncate(biggest.stat().st_size // 2)
    why = S.check_snapshot(copy)
    assert why and f"image file {biggest.name}" in why and "truncated" in why, why


def test_the_snapshot_config_maps_the_runtimes_ids_to_themselves(ort_bundle):
    config = S.snapshot_config(ort_bundle, nofile=1000)
    uid = config["process"]["user"]["uid"]
    m = config["linux"]["uidMappings"]
    assert {"containerID": uid, "hostID": uid, "size": 1} in m and sum(x["size"] for x in m) == USERNS_SIZE
    assert config["process"]["args"][-1] == "--snapshot-point" and os.path.isabs(config["root"]["path"])
    assert {"type": "user"} in config["linux"]["namespaces"]
    assert all(r["hard"] <= 1000 for r in config["process"]["rlimits"] if r["type"] == "RLIMIT_NOFILE")
