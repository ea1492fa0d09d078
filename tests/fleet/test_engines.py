"""The image under real engines: ``podman run`` from the layout and ``umoci unpack`` + ``runc run``
serve the same embeddings as the bundle itself under runc (docs/fleet.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

from support.bundles import READY_DEADLINE_S, bundle_meta, prepare_socket_dir, private_bundle, runc_or_skip, \
    start_container
from fleet_support import PODMAN_GLOBAL, PODMAN_LIMITS, assert_same_embeddings, embed, podman_cleanup, tool_or_skip

from edge.system.readiness import NotifiedProcess, NotReady
from image.bundle.digest import bundle_digest


def test_podman_runs_the_layout_to_ready_and_serves_the_bundles_embeddings(ort_bundle, ort_image, bundle_embeddings,
                                                                            tmp_path):
    podman = tool_or_skip("podman")
    runc_or_skip()
    # podman names the image after the layout's path (no component may start with "."), and pytest's
    # tmp paths recur across runs and checkouts: a name of its own, the stored image removed after
    name = f"edge-fleet-{uuid.uuid4().hex[:8]}"
    layout = tmp_path / name
    layout.symlink_to(ort_image[0])
    meta = bundle_meta(private_bundle(ort_bundle, tmp_path))  # a socket directory of its own: tmp_path/run
    prepare_socket_dir(meta)
    resources = json.loads((ort_bundle / "config.json").read_text())["linux"]["resources"]
    cmd = [podman, *PODMAN_GLOBAL, "run", "--rm", "--name", name, "--sdnotify=container", "--pull=newer",
           *PODMAN_LIMITS,
           "--read-only", "--cap-drop=all", "--security-opt", "no-new-privileges", "--network", "none",
           "--user", f"{meta['user']['uid']}:{meta['user']['gid']}",
           "-v", f"{meta['socket_dir']}:/run/edge", "-v", f"{meta['state_dir']}:/var/lib/edge/runtime",
           "--tmpfs", "/tmp:rw,nosuid,nodev,noexec,mode=1777,size=64m",
           "--memory", str(resources["memory"]["limit"]), "--pids-limit", str(resources["pids"]["limit"]),
           f"oci:{layout}:latest"]
    proc = NotifiedProcess(cmd, notify_path=tmp_path / "notify.sock", log_path=tmp_path / "podman.log")
    try:
        try:
            proc.wait_ready(READY_DEADLINE_S)  # the runtime's READY=1, through --sdnotify=container
        except NotReady as exc:
            raise AssertionError(f"podman run: {exc}\n{proc.output(3000)}") from None
        assert_same_embeddings(embed(meta["address"]), bundle_embeddings)
        # the k8s probes' command (deploy/k8s/daemonset.yaml), by PATH inside the image
        health = subprocess.run([podman, *PODMAN_GLOBAL, "exec", name, "python", "-m", "edge.cli", "health",
                                 "--connect", "ipc:///run/edge/edge.sock"], capture_output=True, text=True, timeout=60)
        assert health.returncode == 0 and json.loads(health.stdout)["ready"] is True, health
        assert proc.stop(30) == 0, proc.output(2000)  # SIGTERM drains; the container exits 0
    finally:
        proc.stop(10)
        podman_cleanup(name, image=f"localhost{layout}:latest")


def _unpack_and_serve(bundle, layout, tmp_path):
    """``umoci unpack`` of the layout's image, checked against ``bundle`` (every file, the process),
    then run by runc with the bundle's own config.json (its mounts, read-only root, limits) over the
    unpacked rootfs: the embeddings of fleet_support.TEXTS."""
    umoci = tool_or_skip("umoci")
    runc_or_skip()
    unpacked = tmp_path / "unpacked"
    r = subprocess.run([umoci, "unpack", "--image", f"{layout}:latest", str(unpacked)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    config = json.loads((bundle / "config.json").read_text())
    # every file and link of the rootfs, byte for byte: the bundle's digest recomputed over the unpacked one
    assert bundle_digest(unpacked / "rootfs", config) == bundle_meta(bundle)["bundle_sha256"]
    umoci_process = json.loads((unpacked / "config.json").read_text())["process"]
    assert umoci_process["args"] == config["process"]["args"]
    assert [e for e in umoci_process["env"] if not e.startswith("TERM=")] == config["process"]["env"]  # umoci adds TERM
    assert (umoci_process["user"]["uid"], umoci_process["user"]["gid"]) == (61000, 61000)
    private = private_bundle(bundle, tmp_path)
    c = json.loads((private / "config.json").read_text())
    c["root"]["path"] = str(unpacked / "rootfs")
    (private / "config.json").write_text(json.dumps(c))
    meta = bundle_meta(private)
    prepare_socket_dir(meta)
    container = start_container(private, tmp_path, prefix="fleet-umoci")
    try:
        container.wait_ready()
        assert os.path.exists(meta["address"][len("ipc://"):])
        return embed(meta["address"])
    finally:
        container.stop()


def test_umoci_unpack_gives_the_bundles_rootfs_and_runc_serves_its_embeddings(ort_bundle, ort_image,
                                                                               bundle_embeddings, tmp_path):
    assert_same_embeddings(_unpack_and_serve(ort_bundle, ort_image[0], tmp_path), bundle_embeddings)


def test_the_torchscript_image_unpacks_to_its_bundle_and_serves_the_same_embeddings(ts_bundle, ts_image,
                                                                                     bundle_embeddings, tmp_path):
    """The other engine's bundle as an image: its labels, its rootfs byte for byte, and under runc
    the embeddings of the onnxruntime bundle (one model, two engines)."""
    layout, summary = ts_image
    meta = bundle_meta(ts_bundle)
    skopeo = tool_or_skip("skopeo")
    got = json.loads(subprocess.run([skopeo, "inspect", f"oci:{layout}:latest"], capture_output=True, text=True,
                                    check=True, timeout=60).stdout)
    assert got["Digest"] == summary["digest"]
    assert got["Labels"]["com.edge.engine"] == "torchscript" == meta["engine"]
    assert got["Labels"]["com.edge.bundle_sha256"] == meta["bundle_sha256"]
    assert_same_embeddings(_unpack_and_serve(ts_bundle, layout, tmp_path), bundle_embeddings)
    print(f"\nimage of the torchscript bundle: {json.dumps(summary['platforms']['amd64'])}", file=sys.stderr)
