"""Helpers of the fleet tests (a uniquely named module: tests/*/conftest.py would shadow each other).

The image of the cached onnxruntime bundle is built once and cached in .cache/images, keyed by
the bundle's digest and the writer's code (image/bundle/oci_image.py): a build takes ~12 s here.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support.bundles import REPO

TEXTS = ["the fleet runs the same bundle", "a Jetson in a cabinet", "ünïcode and émojis 🚀"]
WRITER = REPO / "image" / "bundle" / "oci_image.py"
# What podman 4.3 needs on a host whose root lacks CAP_SYS_RESOURCE (docs/fleet.md).
PODMAN_GLOBAL = ["--runtime", "runc"]
PODMAN_LIMITS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]


def tool_or_skip(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (.ci/run installs it with apt-get)")
    return path


def image_key(bundle: Path) -> str:
    meta = json.loads((bundle / "edge-bundle.json").read_text())
    h = hashlib.sha256(meta["bundle_sha256"].encode() + b"\0" + WRITER.read_bytes() + sys.version.encode())
    return h.hexdigest()[:24]


def cached_image(bundle: Path) -> tuple[Path, dict]:
    """The OCI layout of ``bundle`` and the writer's summary, built once per key."""
    from image.bundle.oci_image import build_image

    cache = REPO / ".cache" / "images"
    cache.mkdir(parents=True, exist_ok=True)
    key = image_key(bundle)
    layout, summary = cache / key / "layout", cache / key / "summary.json"
    with open(cache / f"{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not summary.exists():
            s = build_image([bundle], layout, force=True)
            summary.write_text(json.dumps(s))
    return layout, json.loads(summary.read_text())


# The aarch64 Debian root of the emulated builds: outside the checkout, so that every checkout on
# this machine (CI's clone too) shares the one made by debootstrap, as /usr/local/sbin/criu is shared.
ARM64_ROOT = Path("/var/cache/edge-test/aarch64-bookworm")


def cached_arm64_bundle(package: Path):
    """The aarch64 onnxruntime bundle of ``package`` (edge-bundle emulated), cached like the others
    (support.bundles ``cached_bundle``); a generator."""
    for tool in ("debootstrap", "unshare"):
        tool_or_skip(tool)
    if not Path("/usr/lib/binfmt.d/qemu-aarch64.conf").exists():
        pytest.skip("qemu-user-static is not installed (.ci/run installs it with apt-get)")
    from support.bundles import GID, UID, cached_bundle

    from image.bundle.emulated import build_in_root, make_root

    def say(msg: str) -> None:
        print(f"arm64_bundle: {msg}", file=sys.stderr, flush=True)

    def build(out: Path, socket_dir: Path, state_dir: Path) -> None:
        make_root(ARM64_ROOT, "aarch64", "onnxruntime", say=say)
        rc = build_in_root(ARM64_ROOT, "aarch64", [
            "--out", str(out), "--package", str(package), "--engine", "onnxruntime", "--force", "--quiet", "--allow-dirty",
            "--socket-dir", str(socket_dir), "--user", f"{UID}:{GID}", "--state-dir", str(state_dir)], say=say)
        assert rc == 0, f"edge-bundle emulated: exit {rc}"

    yield from cached_bundle(package, "aarch64", build)


def embed(address: str, texts=TEXTS, timeout_s: float | None = None) -> np.ndarray:
    """The embeddings of `texts` from the runtime at `address`; `timeout_s` is the wait for the reply
    (the client's default when None: an emulated engine needs far longer on a busy machine)."""
    from edge.ipc.client import EdgeClient

    client = EdgeClient(address)
    try:
        return np.asarray(client.embed(list(texts), timeout_s=timeout_s).embeddings)
    finally:
        close = getattr(client, "close", None)
        if close:
            close()


def assert_same_embeddings(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert np.array_equal(got, want) or cos.min() >= 0.9999, cos


def podman_cleanup(name: str, image: str | None = None) -> None:
    """Remove the container and the image podman stored from a layout (its name, not its layers:
    another checkout's run may share them)."""
    subprocess.run(["podman", *PODMAN_GLOBAL, "rm", "--force", "--ignore", name], capture_output=True, timeout=60)
    if image:
        subprocess.run(["podman", *PODMAN_GLOBAL, "untag", image], capture_output=True, timeout=60)
        subprocess.run(["podman", *PODMAN_GLOBAL, "image", "prune", "--force"], capture_output=True, timeout=120)


QUADLET_DEB = "podman"  # Debian trixie's podman (5.x) carries /usr/libexec/podman/quadlet; bookworm's 4.3 has none
QUADLET_SUITE = "trixie"


def _debian_mirror() -> str | None:
    """This host's own Debian mirror, from its apt sources (deb822 or one-line form)."""
    import re

    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        m = re.search(r"^URIs:\s*(\S+)", path.read_text(), re.M)
        if m and "security" not in m.group(1):
            return m.group(1)
    legacy = Path("/etc/apt/sources.list")
    if legacy.exists():
        m = re.search(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+\S+\s+main", legacy.read_text(), re.M)
        if m and "security" not in m.group(1):
            return m.group(1)
    return None


def quadlet_or_skip() -> Path:
    """Quadlet's systemd generator (podman >= 4.4): the installed one, else the one in Debian trixie's
    podman package, downloaded with apt into a private package list and unpacked into .cache/quadlet
    (nothing is installed; it links libc only, and runs here)."""
    installed = Path("/usr/libexec/podman/quadlet")
    if installed.exists():
        return installed
    cache = REPO / ".cache" / "quadlet"
    binary = cache / "root" / "usr" / "libexec" / "podman" / "quadlet"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.exists():
            return binary
        mirror = _debian_mirror()
        if mirror is None or shutil.which("apt-get") is None:
            pytest.skip("no Debian mirror in this host's apt sources to fetch podman >= 4.4's quadlet from")
        lists = cache / "lists"
        (lists / "partial").mkdir(parents=True, exist_ok=True)
        (cache / "apt" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
        sources = cache / "trixie.sources"
        sources.write_text(f"Types: deb\nURIs: {mirror}\nSuites: {QUADLET_SUITE}\nComponents: main\n"
                           f"Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
        opts = ["-o", f"Dir::Etc::sourcelist={sources}", "-o", "Dir::Etc::sourceparts=-",
                "-o", f"Dir::State::Lists={lists}", "-o", f"Dir::Cache={cache / 'apt'}",
                "-o", "APT::Get::List-Cleanup=0"]  # private lists and cache: the host's apt sees none of it
        for cmd in (["apt-get", "update", "-qq", *opts], ["apt-get", "download", "-qq", *opts, QUADLET_DEB]):
            r = subprocess.run(cmd, cwd=cache, capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                pytest.skip(f"could not fetch {QUADLET_SUITE}'s {QUADLET_DEB} for quadlet: {r.stderr.strip()[-300:]}")
        deb = sorted(cache.glob(f"{QUADLET_DEB}_*.deb"))[-1]
        subprocess.run(["dpkg-deb", "-x", str(deb), str(cache / "root")], check=True, timeout=120)
        deb.unlink()
        shutil.rmtree(lists, ignore_errors=True)
        shutil.rmtree(cache / "apt", ignore_errors=True)
    return binary
