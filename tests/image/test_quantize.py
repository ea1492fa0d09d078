"""``edge-package build --quantize int8`` and ``--fallback-*``: the lighter package, its figures, the
package that names it as its fallback, and that fallback in a bundle."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edge.errors import ErrorCode, PackageError
from edge.preload.fallback_package import resolve_fallback
from edge.preload.manifest import manifest_digest, open_package
from image.package import compare_builds
from image.package_cli import main
from image.quantize import (MIN_COSINE, REPORT_FILE, FallbackMismatch, check_fallback, embed_fallback,
                            fallback_request)
from support.parity import bucket_for, parity_sentences


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _embed(package: Path, texts: list[str], rows: int = 16) -> np.ndarray:
    """The runtime's ONNX Runtime engine on the package's tokenizer, in bucket batches of ``rows``
    (not the builder's 32: the figure must hold for other batches too)."""
    from edge.engines import load_engine
    from edge.preload.tokenizer import Tokenizer

    tok = Tokenizer.open(package / "tokenizer.fb")
    engine = load_engine(package, "onnxruntime", device="cpu")
    try:
        groups: dict[int, list[int]] = {}
        for i, t in enumerate(texts):
            groups.setdefault(bucket_for(len(tok.encode(t, max_length=256).ids)), []).append(i)
        out = np.zeros((len(texts), 384), dtype=np.float32)
        for bucket, idx in groups.items():
            for s in range(0, len(idx), rows):
                part = idx[s:s + rows]
                batch = tok.encode_batch([texts[i] for i in part], bucket, max_length=256)
                out[part] = engine.run(batch.input_ids, batch.attention_mask)
        return out
    finally:
        engine.close()
        tok.close()


def test_int8_package_is_smaller_and_says_what_it_is(minilm_int8_package, minilm_package):
    small, full = open_package(minilm_int8_package), open_package(minilm_package)
    m = small.manifest
    assert m.name == "all-MiniLM-L6-v2-int8" and list(m.engines) == ["onnxruntime"]
    assert {"model.ts", "weights.safetensors"}.isdisjoint(m.files)
    assert m.tokenizer_sha256 == full.manifest.tokenizer_sha256
    assert m.files["model.ort"].size < 0.6 * full.manifest.files["model.ort"].size
    q = json.loads((minilm_int8_package / "manifest.json").read_text())["quantization"]
    assert q["method"] == "dynamic" and q["weight_type"] == "int8" and q["per_channel"] is True
    assert q["tool"].startswith("onnxruntime.quantization ") and q["op_types"] == ["MatMul", "Gather"]
    measured = q["measured"]
    assert measured["texts"] == len(parity_sentences())
    assert MIN_COSINE <= measured["cosine_min"] <= measured["cosine_mean"] < 1.0
    assert measured["model_bytes"] == m.files["model.ort"].size
    # Measured against the very fp32 model.ort of the full package (same export, same bytes).
    assert measured["full_model_sha256"] == full.manifest.files["model.ort"].sha256
    assert measured["full_model_bytes"] == full.manifest.files["model.ort"].size
    assert measured["size_ratio"] == pytest.approx(measured["model_bytes"] / measured["full_model_bytes"], abs=1e-4)
    timings = json.loads((minilm_int8_package / REPORT_FILE).read_text())
    assert REPORT_FILE not in m.files and q["timings"] == REPORT_FILE  # a build report, in no hash
    assert timings["shape"] == [8, 128] and timings["ms_per_batch"] > 0 and timings["full_ms_per_batch"] > 0
    assert timings["speed_ratio"] == pytest.approx(timings["ms_per_batch"] / timings["full_ms_per_batch"], abs=2e-3)
    # The self-test reference is the int8 engine's own answer.
    assert m.selftest is not None and m.selftest.computed_with["file"] == "model.ort"


def test_int8_cosine_remeasured_with_the_runtime_engine(minilm_int8_package, minilm_package):
    texts = parity_sentences()
    cos = _cosines(_embed(minilm_int8_package, texts), _embed(minilm_package, texts))
    measured = json.loads((minilm_int8_package / "manifest.json").read_text())["quantization"]["measured"]
    assert cos.min() >= MIN_COSINE, texts[int(cos.argmin())]
    assert abs(cos.mean() - measured["cosine_mean"]) < 1e-3  # the manifest's figure, in other batches


def test_int8_build_is_deterministic(minilm_int8_package, tmp_path):
    """A second int8 build, through the CLI, gives the same package byte for byte (the timing report aside)."""
    assert main(["build", "--out", str(tmp_path / "again"), "--quantize", "int8"]) == 0
    assert (tmp_path / "again" / REPORT_FILE).is_file()
    assert compare_builds(minilm_int8_package, tmp_path / "again") == {}


def test_int8_serves_through_the_runtime(minilm_int8_package, minilm_package, tmp_path):
    """``python -m edge.boot`` on the int8 package: READY, and its replies within MIN_COSINE of the full model."""
    from edge.ipc.client import EdgeClient
    from edge.system.readiness import NotifiedProcess

    address = f"ipc://{tmp_path}/run/edge.sock"
    cmd = [sys.executable, "-m", "edge.boot", "--package", str(minilm_int8_package), "--engine", "onnxruntime",
           "--bind", address, "--timeline", str(tmp_path / "timeline.json")]
    proc = NotifiedProcess(cmd, notify_path=tmp_path / "notify.sock", log_path=tmp_path / "runtime.log",
                           env={**os.environ, "HOME": str(tmp_path)})
    texts = parity_sentences()[::3]
    with proc:
        proc.wait_ready(120.0)
        with EdgeClient(address, timeout_s=60) as client:
            t0 = time.monotonic()
            got = np.concatenate([client.embed(texts[i:i + 16], truncate=True).embeddings
                                  for i in range(0, len(texts), 16)])
            stats = client.stats()
            assert time.monotonic() - t0 < 60
    assert proc.proc.returncode == 0, proc.output()
    lineage = json.dumps(stats)
    assert open_package(minilm_int8_package, verify="none").manifest.package_sha256 in lineage
    cos = _cosines(got, _embed(minilm_package, texts))
    assert cos.min() >= MIN_COSINE, texts[int(cos.argmin())]


def test_int8_refuses_a_torchscript_fallback(tmp_path, capsys):
    rc = main(["build", "--out", str(tmp_path / "p"), "--quantize", "int8", "--fallback-engine", "torchscript"])
    assert rc == 2 and not (tmp_path / "p").exists()
    err = capsys.readouterr().err
    assert "--fallback-engine torchscript" in err and "onnxruntime engine only" in err


# ------------------------------------------------------------------------------ fallback package


@pytest.fixture(scope="module")
def with_fallback(minilm_int8_package, tmp_path_factory) -> Path:
    """The full package naming the int8 one as its fallback (a full build, ~10 s)."""
    out = tmp_path_factory.mktemp("fb") / "pkg"
    assert main(["build", "--out", str(out), "--fallback-package", str(minilm_int8_package)]) == 0
    return out


def test_fallback_package_is_inside_and_pinned(with_fallback, minilm_int8_package):
    pkg = open_package(with_fallback, verify="full")
    int8 = open_package(minilm_int8_package, verify="none").manifest
    fb = pkg.manifest.fallback
    assert fb.to_dict() == {"kind": "package", "path": "fallback", "package_sha256": int8.package_sha256,
                            "engine": "onnxruntime", "device": "cpu"}
    assert "fallback" not in pkg.manifest.files  # the subpackage's own manifest lists and hashes its files
    root, engine, device = resolve_fallback(pkg, verify="full")
    assert (root, engine, device) == (with_fallback / "fallback", "onnxruntime", "cpu")
    assert open_package(root, verify="full").manifest.package_sha256 == int8.package_sha256
    assert not (root / REPORT_FILE).exists()  # the copy holds what the manifest lists, nothing else


def test_bundle_copy_carries_the_fallback_engine_files(with_fallback, tmp_path):
    from image.bundle.package_copy import copy_package, package_files
    from image.bundle.rootfs import PACKAGE_PATH, Rootfs

    fallback = ["fallback/manifest.json", "fallback/model.ort", "fallback/model.onnx", "fallback/tokenizer.fb"]
    for engine in ("torchscript", "onnxruntime"):  # the fallback's own engine, whatever the bundle's
        carried, left_out = package_files(with_fallback, engine)
        assert set(fallback) <= set(carried) and not any(n.startswith("fallback/") for n in left_out)
    rootfs = Rootfs(tmp_path / "rootfs")
    copy_package(rootfs, with_fallback, carried)
    inside = rootfs.inside(PACKAGE_PATH)
    assert oct((inside / "fallback").stat().st_mode & 0o777) == "0o755"
    bundled = open_package(inside, verify="full", engine="onnxruntime")
    root, _, _ = resolve_fallback(bundled, verify="full")
    assert root == inside / "fallback"


def test_bundle_refuses_a_fallback_missing_its_engine_files(with_fallback, tmp_path):
    from image.bundle.package_copy import package_files

    broken = tmp_path / "pkg"
    shutil.copytree(with_fallback, broken)
    (broken / "fallback" / "model.ort").unlink()
    with pytest.raises(PackageError) as info:
        package_files(broken, "onnxruntime")
    assert info.value.file == "fallback/model.ort" and info.value.code == ErrorCode.PACKAGE_FILE_MISSING
    shutil.copyfile(with_fallback / "fallback" / "model.ort", broken / "fallback" / "model.ort")
    data = json.loads((broken / "fallback" / "manifest.json").read_text())
    data["name"] = "another"  # a valid package, but not the one pinned
    data["package_sha256"] = manifest_digest(data)
    (broken / "fallback" / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(PackageError) as info:
        package_files(broken, "onnxruntime")
    assert info.value.code == ErrorCode.PACKAGE_HASH_MISMATCH and info.value.setting == "fallback.package_sha256"


def test_fallback_with_another_tokenizer_is_refused(minilm_int8_package, tmp_path, capsys):
    """The fallback takes requests tokenized by the primary's tokenizer: another one is a usage error."""
    other = tmp_path / "other"
    shutil.copytree(minilm_int8_package, other)
    fb = (other / "tokenizer.fb").read_bytes()
    request = fallback_request(other, None, None)
    assert request == {"package": other, "engine": "onnxruntime", "device": "cpu"}
    check_fallback(request, fb, 384, 256)  # the same: fine
    with pytest.raises(FallbackMismatch, match="tokenizer_sha256"):
        check_fallback(request, fb + b"\0", 384, 256)
    with pytest.raises(FallbackMismatch, match="output_dim"):
        check_fallback(request, fb, 768, 256)
    # A valid package with another tokenizer: found once this build's tokenizer is compiled, seconds in.
    (other / "tokenizer.fb").write_bytes(fb + b"\0")
    data = json.loads((other / "manifest.json").read_text())
    data["files"]["tokenizer.fb"] = {"sha256": hashlib.sha256(fb + b"\0").hexdigest(), "size": len(fb) + 1}
    data["tokenizer_sha256"] = data["files"]["tokenizer.fb"]["sha256"]
    data["package_sha256"] = manifest_digest(data)
    (other / "manifest.json").write_text(json.dumps(data))
    open_package(other, verify="full")
    assert main(["build", "--out", str(tmp_path / "p"), "--fallback-package", str(other)]) == 2
    assert "its tokenizer_sha256 is" in capsys.readouterr().err and not (tmp_path / "p").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["other"]  # no staging directory left beside --out
    with open(other / "tokenizer.fb", "r+b") as f:  # a tampered fallback: refused before any work
        f.write(b"X")
    assert main(["build", "--out", str(tmp_path / "p"), "--fallback-package", str(other)]) == 2
    assert "cannot serve as a fallback" in capsys.readouterr().err and not (tmp_path / "p").exists()


def test_device_fallback_is_recorded(tmp_path, monkeypatch):
    """``--fallback-device cpu`` alone: this package's own files on the CPU (the build itself is not rerun:
    the request the CLI hands build_package is what is checked)."""
    seen = {}

    def fake_build(out, **options):
        seen.update(options)
        raise KeyboardInterrupt  # stop before the minute of work; the CLI reports it as an interruption

    monkeypatch.setattr("image.package_cli.build_package", fake_build)
    main(["build", "--out", str(tmp_path / "p"), "--fallback-device", "cpu"])
    assert seen["fallback"] == {"package": None, "engine": "onnxruntime", "device": "cpu"}
    assert seen["quantize"] is None
    assert embed_fallback(tmp_path, seen["fallback"]) == {"kind": "device", "engine": "onnxruntime", "device": "cpu"}
    assert not any(tmp_path.iterdir())  # nothing copied for a device fallback
