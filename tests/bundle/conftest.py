"""Bundle fixtures: the MiniLM bundle built once, cached by its inputs (see bundle_support)."""

from __future__ import annotations

import fcntl
import shutil
from pathlib import Path

import pytest

from bundle_support import GID, REPO, UID, bundle_key


@pytest.fixture(scope="session")
def ort_bundle(minilm_package):
    """The onnxruntime bundle of the MiniLM package (read-only for tests)."""
    from image.build_bundle import build_bundle

    cache = REPO / ".cache" / "bundles"
    cache.mkdir(parents=True, exist_ok=True)
    key = bundle_key(minilm_package)
    out = cache / key / "bundle"
    lock = open(cache / f"{key}.lock", "a")
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (out / "edge-bundle.json").exists():
        build_bundle(out, package=minilm_package, engine="onnxruntime", socket_dir=str(cache / key / "run"),
                     user=(UID, GID), force=True)
    fcntl.flock(lock, fcntl.LOCK_SH)  # held while this session uses it: _prune of another session skips it
    _prune(cache, keep=key)
    yield out
    lock.close()


def _prune(cache: Path, keep: str) -> None:
    """Remove bundles of older inputs (~400 MB each), unless another pytest holds their lock."""
    for lock_path in cache.glob("*.lock"):
        key = lock_path.stem
        if key == keep:
            continue
        with open(lock_path, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            shutil.rmtree(cache / key, ignore_errors=True)
            lock_path.unlink(missing_ok=True)


