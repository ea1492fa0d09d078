"""A bundle carries only its engine's share of the model package (image/bundle/package_copy.py):
the manifest unchanged, the tokenizer and the engine's files, and still boots under runc."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import numpy as np
import pytest

from edge.errors import ErrorCode, PackageError
from edge.preload.manifest import open_package
from image.bundle.rootfs import PACKAGE_PATH

from support.bundles import bundle_meta, prepare_socket_dir, private_bundle, runc_or_skip, start_container

EXPECTED = {"onnxruntime": {"manifest.json", "tokenizer.fb", "model.ort", "model.onnx"},
            "torchscript": {"manifest.json", "tokenizer.fb", "model.ts", "weights.safetensors"}}


def _package_dir(bundle: Path) -> Path:
    return bundle / "rootfs" / PACKAGE_PATH.lstrip("/")


def _check_package(bundle: Path, package: Path, engine: str) -> None:
    pkg_dir = _package_dir(bundle)
    held = {p.name: p for p in pkg_dir.iterdir()}
    assert set(held) == EXPECTED[engine]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o444 for p in held.values())
    source = json.loads((package / "manifest.json").read_text())
    meta = bundle_meta(bundle)
    assert meta["engine"] == engine
    assert meta["package"]["files"][0] == "manifest.json" and set(meta["package"]["files"]) == EXPECTED[engine]
    assert set(meta["package"]["left_out"]) == set(source["files"]) - EXPECTED[engine] != set()
    assert meta["package"]["bytes"] == meta["sizes"]["package_bytes"] == sum(p.stat().st_size for p in held.values())
    assert (pkg_dir / "manifest.json").read_bytes() == (package / "manifest.json").read_bytes()
    for name in EXPECTED[engine] - {"manifest.json"}:
        assert (pkg_dir / name).read_bytes() == (package / name).read_bytes(), name
    # What the boot checks (edge/boot.py: open_package(..., engine)) passes, hashes included ...
    assert open_package(pkg_dir, verify="full", engine=engine).identity["package_sha256"] == source["package_sha256"]
    # ... and the package is not whole: every file, as before, names one the bundle left out.
    with pytest.raises(PackageError) as info:
        open_package(pkg_dir, verify="size")
    assert info.value.code == ErrorCode.PACKAGE_FILE_MISSING and info.value.file in meta["package"]["left_out"]


def test_the_ort_bundle_carries_only_its_engines_files(ort_bundle, minilm_package):
    _check_package(ort_bundle, minilm_package, "onnxruntime")


def test_the_torchscript_bundle_carries_only_its_engines_files(ts_bundle, minilm_package):
    _check_package(ts_bundle, minilm_package, "torchscript")


def test_the_torchscript_bundle_boots_and_embeds_without_the_ort_files(ts_bundle, tmp_path):
    """The runtime's own check (verify=full, the default) passes on the engine's share alone."""
    from edge.ipc.client import EdgeClient

    runc_or_skip()
    bundle = private_bundle(ts_bundle, tmp_path)  # the cached bundle's socket directory stays unshared
    meta = bundle_meta(bundle)
    prepare_socket_dir(meta)
    c = start_container(bundle, tmp_path, prefix="edge-ts")
    try:
        c.wait_ready()
        with EdgeClient(meta["address"], timeout_s=60) as client:
            result = client.embed(["a bundle of one engine"])
            stats = client.stats()
        assert result.embeddings.shape == (1, 384) and np.isfinite(result.embeddings).all()
        assert stats["lineage"]["engine"] == "torchscript"
        assert stats["lineage"]["package_sha256"] == meta["package"]["package_sha256"]
    finally:
        c.stop()


def test_a_package_missing_a_file_of_the_engine_is_refused_before_the_trace(minilm_package, tmp_path):
    from image.build_bundle import BundleError, build_bundle

    package = tmp_path / "pkg"
    package.mkdir()
    for p in minilm_package.iterdir():
        if p.name != "weights.safetensors":
            (package / p.name).symlink_to(p.resolve())
    with pytest.raises(BundleError) as info:
        build_bundle(tmp_path / "b", package=package, engine="torchscript", socket_dir=str(tmp_path / "run"))
    assert "weights.safetensors" in str(info.value) and "torchscript" in str(info.value)
    assert not (tmp_path / "b").exists()
    # The other engine's bundle does not need the file: its check passes (the build is not run here).
    from image.bundle.package_copy import package_files

    carried, left_out = package_files(package, "onnxruntime")
    assert set(carried) == EXPECTED["onnxruntime"] and "weights.safetensors" in left_out
