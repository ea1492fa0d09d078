"""Small model packages for tests that read manifests and hashes only (a few bytes per file), and
copies of a real package to tamper with."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from edge.preload import verity
from edge.preload.manifest import manifest_digest, model_digest

__all__ = ["SMALL_FILES", "write_small_package", "clone", "flip_byte", "rewrite_manifest"]

SMALL_FILES = {"model.ort": b"ort bytes " * 1000, "tokenizer.fb": b"tokenizer bytes"}


def write_small_package(root: Path, files: dict[str, bytes] = SMALL_FILES, digests: dict[str, str] | None = None,
                        *, fsverity: bool = True, **fields) -> dict:
    """A valid package at ``root`` holding ``files``; returns its manifest. With ``fsverity`` the
    manifest gives each file's fs-verity digest (``digests`` instead of the computed ones);
    ``fields``: more manifest fields (``fallback``, ``selftest``, ...), as given."""
    root.mkdir(parents=True, exist_ok=True)
    entries = {}
    for name, content in files.items():
        (root / name).write_bytes(content)
        entries[name] = {"sha256": hashlib.sha256(content).hexdigest(), "size": len(content)}
    data = {"format_version": 1, "name": root.name, "files": entries,
            "model_sha256": model_digest({n: e["sha256"] for n, e in entries.items()}),
            "tokenizer_sha256": entries.get("tokenizer.fb", {}).get("sha256"),
            "inputs": [], "outputs": [{"name": "embedding", "dtype": "float32", "shape": ["batch", 4]}],
            "output_dim": 4, "max_seq_length": 16, "pooling": "mean", "normalize": True, "vocab_size": 10,
            "engines": {"onnxruntime": {"files": ["model.ort"], "file": "model.ort"}}, "serving": {},
            "source": {}, "tool_versions": {}, **fields}
    if fsverity:
        data["fsverity"] = {"algorithm": verity.ALGORITHM, "block_size": verity.BLOCK_SIZE,
                            "digests": digests or {n: verity.file_digest(root / n) for n in files}}
    data["package_sha256"] = manifest_digest(data)
    (root / "manifest.json").write_text(json.dumps(data))
    return data


def clone(src: Path, dst: Path, *, copy: tuple[str, ...] = ()) -> Path:
    """A package directory whose files link to ``src`` except ``copy`` (real copies, safe to modify)."""
    dst.mkdir()
    for p in src.iterdir():
        if p.name in copy or p.name == "manifest.json":
            shutil.copyfile(p, dst / p.name)
        else:
            (dst / p.name).symlink_to(p.resolve())
    return dst


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))


def rewrite_manifest(root: Path, edit, *, rehash: bool = True) -> None:
    data = json.loads((root / "manifest.json").read_text())
    edit(data)
    if rehash:
        data["package_sha256"] = manifest_digest(data)
    (root / "manifest.json").write_text(json.dumps(data))
