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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bundle"))

from bundle_support import REPO  # noqa: E402

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


def embed(address: str, texts=TEXTS) -> np.ndarray:
    from edge.ipc.client import EdgeClient

    client = EdgeClient(address)
    try:
        return np.asarray(client.embed(list(texts)).embeddings)
    finally:
        close = getattr(client, "close", None)
        if close:
            close()


def assert_same_embeddings(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert np.array_equal(got, want) or cos.min() >= 0.9999, cos


def podman_cleanup(name: str) -> None:
    subprocess.run(["podman", *PODMAN_GLOBAL, "rm", "--force", "--ignore", name], capture_output=True, timeout=60)
