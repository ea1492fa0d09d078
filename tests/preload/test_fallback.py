"""The manifest's ``fallback`` block (edge/preload/fallback.py): read, refused naming the field, resolved.

Small packages written here (a few bytes per file), not the real model: the reader and the
resolver look at manifests and hashes only.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edge.errors import ErrorCode, PackageError
from edge.preload.fallback import FallbackSpec
from edge.preload.fallback_package import resolve_fallback
from edge.preload.manifest import Manifest, open_package
from edge.preload.schema import Invalid
from support.packages import write_small_package


SHA = "ab" * 32
PACKAGE_FB = {"kind": "package", "path": "fallback", "package_sha256": SHA, "engine": "onnxruntime", "device": "cpu"}
DEVICE_FB = {"kind": "device", "engine": "onnxruntime", "device": "cpu"}


def write_package(root: Path, files: dict[str, bytes] | None = None, fallback: dict | None = None, **fields) -> dict:
    """A valid package at ``root`` whose files hold ``files``; returns its manifest."""
    files = {"model.ort": b"ort bytes", "tokenizer.fb": b"tokenizer bytes"} if files is None else files
    extra = {"fallback": fallback} if fallback is not None else {}
    return write_small_package(root, files, fsverity=False, **fields, **extra)


def manifest(**fields) -> dict:
    return {"format_version": 1, "name": "m", "model_sha256": SHA, "package_sha256": SHA, "files": {}, "inputs": [],
            "outputs": [], "output_dim": 4, "max_seq_length": 16, "pooling": "mean", "normalize": True,
            "vocab_size": 10, "engines": {"onnxruntime": {"files": []}}, "serving": {}, "source": {},
            "tool_versions": {}, **fields}


@pytest.mark.parametrize("block", [PACKAGE_FB, DEVICE_FB, {**DEVICE_FB, "device": "cuda"}])
def test_blocks_round_trip(block):
    spec = Manifest.model_validate(manifest(fallback=block)).fallback
    assert isinstance(spec, FallbackSpec) and spec.to_dict() == block
    assert (spec.kind, spec.engine, spec.device) == (block["kind"], block["engine"], block["device"])
    with pytest.raises(AttributeError):
        spec.device = "cuda"  # read-only


@pytest.mark.parametrize("block", [None, {"kind": "another-runtime's", "whatever": 1}])
def test_missing_null_or_unknown_kind_is_none(block):
    data = manifest() if block is None else manifest(fallback=block)
    assert Manifest.model_validate(data).fallback is None
    assert Manifest.model_validate(manifest(fallback=None)).fallback is None


@pytest.mark.parametrize("block, field, says", [
    ("cpu", "fallback", "expected an object"),
    ({"engine": "onnxruntime", "device": "cpu"}, "fallback.kind", "field required"),
    ({**DEVICE_FB, "engine": "tensorrt"}, "fallback.engine", "must be one of"),
    ({**DEVICE_FB, "device": "auto"}, "fallback.device", "must be one of"),
    ({"kind": "device", "engine": "onnxruntime"}, "fallback.device", "field required"),
    ({**DEVICE_FB, "path": "fallback"}, "fallback.path", "only a fallback of kind 'package'"),
    ({**DEVICE_FB, "engine": "torchscript"}, "fallback.engine", "no files for it"),
    ({**PACKAGE_FB, "path": "../elsewhere"}, "fallback.path", "not a directory name"),
    ({**PACKAGE_FB, "path": "a/b"}, "fallback.path", "not a directory name"),
    ({**PACKAGE_FB, "path": ""}, "fallback.path", "not a directory name"),
    ({**PACKAGE_FB, "path": "x\n"}, "fallback.path", "control character"),
    ({**PACKAGE_FB, "package_sha256": "AB" * 32}, "fallback.package_sha256", "sha256"),
    ({k: v for k, v in PACKAGE_FB.items() if k != "path"}, "fallback.path", "field required"),
])
def test_bad_blocks_are_refused_naming_the_field(block, field, says):
    with pytest.raises(Invalid) as info:
        Manifest.model_validate(manifest(fallback=block))
    assert info.value.where == field and says in info.value.reason


def test_open_package_refuses_a_bad_block_as_a_package_error(tmp_path):
    write_package(tmp_path / "p", fallback={**DEVICE_FB, "device": "gpu"})
    with pytest.raises(PackageError) as info:
        open_package(tmp_path / "p")
    assert info.value.code == ErrorCode.PACKAGE_INVALID and info.value.file == "manifest.json"
    assert "fallback.device" in str(info.value)


def test_resolve_none_and_device(tmp_path):
    write_package(tmp_path / "plain")
    assert resolve_fallback(open_package(tmp_path / "plain")) is None
    write_package(tmp_path / "dev", fallback=DEVICE_FB)
    assert resolve_fallback(open_package(tmp_path / "dev")) == (tmp_path / "dev", "onnxruntime", "cpu")


def _with_fallback(root: Path, **sub_fields) -> dict:
    sub = write_package(root / "fallback", **sub_fields)
    write_package(root, fallback={**PACKAGE_FB, "package_sha256": sub["package_sha256"]})
    return sub


def test_resolve_package(tmp_path):
    _with_fallback(tmp_path / "p")
    pkg = open_package(tmp_path / "p")
    for verify in ("none", "size", "full"):
        assert resolve_fallback(pkg, verify=verify) == (tmp_path / "p" / "fallback", "onnxruntime", "cpu")


def test_resolve_refuses_a_replaced_fallback(tmp_path):
    _with_fallback(tmp_path / "p")
    write_package(tmp_path / "p" / "fallback", files={"model.ort": b"other bytes", "tokenizer.fb": b"tokenizer bytes"})
    with pytest.raises(PackageError) as info:
        resolve_fallback(open_package(tmp_path / "p"))
    assert info.value.code == ErrorCode.PACKAGE_HASH_MISMATCH and info.value.setting == "fallback.package_sha256"
    assert info.value.file == "fallback/manifest.json"


def test_resolve_names_the_fallback_file_at_fault(tmp_path):
    _with_fallback(tmp_path / "p")
    (tmp_path / "p" / "fallback" / "model.ort").write_bytes(b"ort bytez")  # same size, other bytes
    pkg = open_package(tmp_path / "p")
    assert resolve_fallback(pkg, verify="size")  # a size check cannot see it
    with pytest.raises(PackageError) as info:
        resolve_fallback(pkg, verify="full")
    assert info.value.code == ErrorCode.PACKAGE_HASH_MISMATCH and info.value.file == "fallback/model.ort"
    (tmp_path / "p" / "fallback" / "model.ort").unlink()
    with pytest.raises(PackageError) as info:
        resolve_fallback(pkg, verify="size")
    assert info.value.code == ErrorCode.PACKAGE_FILE_MISSING and info.value.file == "fallback/model.ort"


def test_resolve_refuses_another_tokenizer_or_width(tmp_path):
    _with_fallback(tmp_path / "tok", files={"model.ort": b"ort bytes", "tokenizer.fb": b"another tokenizer"})
    with pytest.raises(PackageError, match="tokenizer or output width"):
        resolve_fallback(open_package(tmp_path / "tok"))
    _with_fallback(tmp_path / "dim", output_dim=8,
                   outputs=[{"name": "embedding", "dtype": "float32", "shape": ["batch", 8]}])
    with pytest.raises(PackageError, match="tokenizer or output width"):
        resolve_fallback(open_package(tmp_path / "dim"))


def test_resolve_refuses_a_fallback_without_the_engine(tmp_path):
    sub = write_package(tmp_path / "p" / "fallback")
    write_package(tmp_path / "p", fallback={**PACKAGE_FB, "engine": "torchscript",
                                            "package_sha256": sub["package_sha256"]})
    with pytest.raises(PackageError) as info:
        resolve_fallback(open_package(tmp_path / "p"))
    assert "torchscript" in str(info.value) and info.value.file == "fallback/manifest.json"
