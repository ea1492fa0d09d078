"""The Engine interface: shapes, dtypes, errors, settings; ORT's C API table."""

from __future__ import annotations

import ctypes
from importlib import metadata

import numpy as np
import pytest

from edge.engines import Engine, check_batch, load_engine
from edge.errors import EngineError, ErrorCode


def test_engine_protocol_and_info(engine):
    assert isinstance(engine, Engine)
    assert engine.device == "cpu"
    assert engine.info["map_ms"] >= 0 and engine.info["load_ms"] >= engine.info["map_ms"]
    ids = np.array([[101, 7592, 102, 0]], dtype=np.int64)
    mask = np.array([[1, 1, 1, 0]], dtype=np.int64)
    out = engine.run(ids, mask)
    assert out.shape == (1, 384) and out.dtype == np.float32 and out.flags.c_contiguous


def test_int32_and_noncontiguous_inputs_are_accepted(engine):
    ids = np.array([[101, 7592, 2088, 102]], dtype=np.int64)
    mask = np.ones_like(ids)
    ref = engine.run(ids, mask)
    np.testing.assert_array_equal(engine.run(ids.astype(np.int32), mask.astype(np.int32)), ref)
    strided = np.repeat(ids, 2, axis=1)[:, ::2]  # a non-contiguous view of the same values
    assert not strided.flags.c_contiguous
    np.testing.assert_array_equal(engine.run(strided, mask), ref)


@pytest.mark.parametrize(
    "ids_shape,mask_shape",
    [((4,), (4,)), ((1, 4), (1, 5)), ((0, 4), (0, 4)), ((1, 0), (1, 0))],
)
def test_bad_batches_are_rejected(ids_shape, mask_shape):
    with pytest.raises(ValueError):
        check_batch(np.zeros(ids_shape, np.int64), np.zeros(mask_shape, np.int64))


@pytest.mark.parametrize("name", ["onnxruntime", "torchscript"])
def test_close_is_idempotent_and_final(minilm_package, name):
    eng = load_engine(minilm_package, name, device="cpu")
    eng.close()
    eng.close()
    with pytest.raises(RuntimeError):
        eng.run(np.ones((1, 4), np.int64), np.ones((1, 4), np.int64))


def test_unknown_engine_and_option(minilm_package):
    with pytest.raises(EngineError) as info:
        load_engine(minilm_package, "tensorflow")
    assert info.value.code == ErrorCode.ENGINE_UNAVAILABLE
    with pytest.raises(EngineError) as info:
        load_engine(minilm_package, "onnxruntime", device="cpu", warp_drive=True)
    assert "warp_drive" in str(info.value)


@pytest.mark.parametrize("name", ["onnxruntime", "torchscript"])
def test_cuda_request_without_cuda(minilm_package, name):
    import torch

    from edge.engines.ort_capi import load_library

    has = torch.cuda.is_available() if name == "torchscript" else (
        "CUDAExecutionProvider" in load_library().available_providers())
    if has:
        pytest.skip("this machine has CUDA")
    with pytest.raises(EngineError) as info:
        load_engine(minilm_package, name, device="cuda")
    assert info.value.code == ErrorCode.ENGINE_UNAVAILABLE
    with pytest.raises(EngineError):
        load_engine(minilm_package, name, device="tpu")
    assert load_engine(minilm_package, name, device="auto").device == "cpu"


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["onnxruntime", "torchscript"])
def test_cuda_engine_matches_cpu(minilm_package, name):
    import torch

    from edge.engines.ort_capi import load_library

    has = torch.cuda.is_available() if name == "torchscript" else (
        "CUDAExecutionProvider" in load_library().available_providers())
    if not has:
        pytest.skip(f"no CUDA for {name} on this machine")
    gpu = load_engine(minilm_package, name, device="cuda")
    cpu = load_engine(minilm_package, name, device="cpu")
    assert gpu.device.startswith("cuda")
    ids = np.random.default_rng(0).integers(1000, 20000, (8, 64)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[:, 40:] = 0
    np.testing.assert_allclose(gpu.run(ids, mask), cpu.run(ids, mask), atol=1e-4)


# -- ONNX Runtime's C API through ctypes ---------------------------------------------------


def test_ort_library_version_matches_wheel():
    from edge.engines.ort_capi import load_library

    lib = load_library()
    assert lib.version == metadata.version("onnxruntime").split("+")[0]
    assert "CPUExecutionProvider" in lib.available_providers()


def test_ort_table_entries_behave_as_named():
    """Entries past the ones the engine exercises on a CPU build: CUDA and TensorRT option calls."""
    from edge.engines.ort_capi import OrtError, load_library

    lib = load_library()
    providers = lib.available_providers()
    for call, ep, release in [("CreateCUDAProviderOptions", "CUDA", "ReleaseCUDAProviderOptions"),
                              ("CreateTensorRTProviderOptions", "TensorRT", "ReleaseTensorRTProviderOptions")]:
        handle = ctypes.c_void_p()
        try:
            lib.call(call, ctypes.byref(handle))
        except OrtError as exc:  # a CPU build says which provider it lacks: the right entry was called
            assert ep in exc.message and f"{'Tensorrt' if ep == 'TensorRT' else ep}ExecutionProvider" not in providers
        else:
            assert handle.value
            lib.release(release, handle)


def test_ort_bad_model_bytes_are_engine_errors(minilm_package, tmp_path):
    """A package whose model.ort is garbage (with a matching manifest) fails as ENGINE_LOAD_FAILED."""
    import json
    import shutil

    from edge.preload.manifest import manifest_digest, model_digest, sha256_file

    root = tmp_path / "pkg"
    root.mkdir()
    for p in minilm_package.iterdir():
        if p.name not in ("model.ort", "manifest.json"):
            (root / p.name).symlink_to(p.resolve())
    (root / "model.ort").write_bytes(b"\0" * 4096)
    data = json.loads((minilm_package / "manifest.json").read_text())
    data["files"]["model.ort"] = {"sha256": sha256_file(root / "model.ort"), "size": 4096}
    del data["sha256_chunks"]["digests"]["model.ort"]  # one chunk now: its sha256 is the file's
    data["model_sha256"] = model_digest({n: e["sha256"] for n, e in data["files"].items()})
    data["package_sha256"] = manifest_digest(data)
    (root / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(EngineError) as info:
        load_engine(root, "onnxruntime", device="cpu")
    assert info.value.code == ErrorCode.ENGINE_LOAD_FAILED and "model.ort" in str(info.value)
    shutil.rmtree(root)


def test_importing_edge_engines_imports_no_engine_library():
    import subprocess
    import sys

    code = ("import sys, edge.engines, edge.engines.ort, edge.preload.manifest, edge.preload.weights; "
            "print(sorted(m for m in ('torch', 'onnxruntime') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_ort_engine_loads_and_warms_without_numpy(minilm_package):
    """Boot creates and warms the session while its main thread still imports numpy."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from edge.preload.manifest import open_package\n"
        "from edge.engines import load_engine\n"
        f"pkg = open_package({str(minilm_package)!r}, 'size')\n"
        "engine = load_engine(pkg, 'onnxruntime', 'cpu')\n"
        "ids = [101, 7592, 2088, 102]\n"
        "ok = [engine.warm_run(b, t, ids) for b, t in ((1, 16), (2, 4))]\n"
        "print(ok, 'numpy' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[True, True] False"


def test_ort_warm_run_feeds_the_same_batch_as_run(minilm_package):
    """warm_run's ctypes inputs are the batch run() would get: (B, T), ids left-aligned, mask 1 on them."""
    engine = load_engine(minilm_package, "onnxruntime", "cpu")
    seen = []
    real_run = engine._run

    def spy(ids_address, mask_address, out_address, batch, tokens):
        n = batch * tokens
        seen.append((batch, tokens, list((ctypes.c_int64 * n).from_address(ids_address)),
                     list((ctypes.c_int64 * n).from_address(mask_address))))
        return real_run(ids_address, mask_address, out_address, batch, tokens)

    engine._run = spy
    try:
        assert engine.warm_run(2, 6, [101, 7592, 2088, 102])
    finally:
        del engine._run
        engine.close()
    assert seen == [(2, 6, [101, 7592, 2088, 102, 0, 0] * 2, [1, 1, 1, 1, 0, 0] * 2)]
