"""The aarch64 (Jetson) manifest of a multi-architecture image, for real: the MiniLM bundle built
for aarch64 on this host under qemu-user (``edge-bundle emulated``), put in one index with the
amd64 bundle, resolved by the engines per platform and run by podman under emulation, where it
serves the embeddings of the amd64 bundle (docs/fleet.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

from support.bundles import READY_DEADLINE_S, bundle_meta, prepare_socket_dir, private_bundle, runc_or_skip
from fleet_support import PODMAN_GLOBAL, PODMAN_LIMITS, assert_same_embeddings, embed, podman_cleanup, tool_or_skip

from edge.system.readiness import NotifiedProcess, NotReady
from image.bundle.digest import bundle_digest
from image.bundle.emulated import EMULATED_MASKS, QEMU_CPU
from image.bundle.oci_image import build_image

EMULATED_READY_S = max(READY_DEADLINE_S, 240.0)  # the boot under qemu took 38 s here, alone


def test_the_arm64_manifest_resolves_unpacks_and_serves_the_amd64_embeddings_under_emulation(
        arm64_bundle, ort_bundle, bundle_embeddings, tmp_path):
    skopeo, umoci, podman = tool_or_skip("skopeo"), tool_or_skip("umoci"), tool_or_skip("podman")
    runc_or_skip()
    arm = bundle_meta(arm64_bundle)
    assert arm["arch"] == "aarch64" and arm["engine"] == "onnxruntime"
    assert arm["package"]["package_sha256"] == bundle_meta(ort_bundle)["package"]["package_sha256"]
    name = f"edge-arm64-{uuid.uuid4().hex[:8]}"  # podman names the image after the layout's path
    layout = tmp_path / name
    summary = build_image([arm64_bundle, ort_bundle], layout)
    print(f"\nimage of the aarch64 bundle: {json.dumps(summary['platforms']['arm64'])}", file=sys.stderr)

    # an arm64 node's engine resolves the tag to the aarch64 bundle's image
    got = subprocess.run([skopeo, "--override-arch", "arm64", "inspect", f"oci:{layout}:latest"], capture_output=True,
                         text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    labels = json.loads(got.stdout)["Labels"]
    assert labels["com.edge.arch"] == "aarch64" and labels["com.edge.bundle_sha256"] == arm["bundle_sha256"]

    # its layer is the aarch64 rootfs, every file of it
    unpacked = tmp_path / "unpacked"
    r = subprocess.run([umoci, "unpack", "--image", f"{layout}:latest-arm64", str(unpacked)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    config = json.loads((arm64_bundle / "config.json").read_text())
    assert bundle_digest(unpacked / "rootfs", config) == arm["bundle_sha256"]

    # podman takes the arm64 manifest from the index and runs it under qemu (binfmt_misc); QEMU_CPU
    # and the masked CPU topology are emulation's needs (image/bundle/emulated.py), not the image's
    meta = bundle_meta(private_bundle(arm64_bundle, tmp_path))  # a socket directory of its own
    prepare_socket_dir(meta)
    cmd = [podman, *PODMAN_GLOBAL, "run", "--rm", "--name", name, "--arch", "arm64", "--sdnotify=container",
           "--pull=newer", *PODMAN_LIMITS, "-e", f"QEMU_CPU={QEMU_CPU}",
           *[a for m in EMULATED_MASKS for a in ("--security-opt", f"mask={m}")],
           "--read-only", "--cap-drop=all", "--security-opt", "no-new-privileges", "--network", "none",
           "--user", f"{meta['user']['uid']}:{meta['user']['gid']}",
           "-v", f"{meta['socket_dir']}:/run/edge", "-v", f"{meta['state_dir']}:/var/lib/edge/runtime",
           "--tmpfs", "/tmp:rw,nosuid,nodev,noexec,mode=1777,size=64m", f"oci:{layout}:latest"]
    proc = NotifiedProcess(cmd, notify_path=tmp_path / "notify.sock", log_path=tmp_path / "podman.log")
    try:
        try:
            proc.wait_ready(EMULATED_READY_S)
        except NotReady as exc:
            raise AssertionError(f"podman run --arch arm64: {exc}\n{proc.output(3000)}") from None
        machine = subprocess.run([podman, *PODMAN_GLOBAL, "exec", name, "python", "-c",
                                  "import platform; print(platform.machine())"], capture_output=True, text=True,
                                 timeout=120)
        assert machine.stdout.strip() == "aarch64", machine
        # the first inference under qemu: 1.2 s alone here, past the client's 5 s when CI's machine was busy
        assert_same_embeddings(embed(meta["address"], timeout_s=EMULATED_READY_S), bundle_embeddings)
        assert proc.stop(60) == 0, proc.output(2000)  # SIGTERM drains; the container exits 0
    finally:
        proc.stop(10)
        podman_cleanup(name, image=f"localhost{layout}:latest")
