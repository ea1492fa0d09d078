"""ONNX Runtime engine: the ORT-format model mapped read-only and run in place.

On the CPU the session is created with ``CreateSessionFromArray`` on a ``PROT_READ``
mapping of ``model.ort`` and the two config entries that make ORT use those bytes as they
are, initializers included; nothing of the model is copied into anonymous memory.
ORT's MLAS pre-packs MatMul weights into new buffers by default (+10 to 50 MiB, measured
on MiniLM): the ``prepacking`` option (default off) turns that back on for a few percent of
latency at large batches; see bench/engines.py for the figures.

With ``device`` "cuda" (or "auto" on a machine whose ORT build lists the CUDA execution
provider) the session uses the CUDA EP, and TensorRT first when ``tensorrt=True``. Those
sessions are built from ``model.onnx`` (the ORT file's graph was optimised for the CPU EP);
its weights are uploaded to the device, so the host mapping only feeds the upload.
"""

from __future__ import annotations

import ctypes
import math
import time
from ctypes import POINTER, byref, c_char_p, c_int64, c_size_t, c_void_p
from typing import TYPE_CHECKING

from edge.engines.base import check_batch
from edge.engines.ort_capi import (
    ALLOCATOR_ARENA,
    LOGGING_ERROR,
    MEM_TYPE_DEFAULT,
    ORT_DISABLE_ALL,
    ORT_ENABLE_ALL,
    TENSOR_FLOAT,
    TENSOR_INT64,
    OrtError,
    load_library,
)
from edge.errors import EngineError, ErrorCode
from edge.preload.mapping import MappedFile, map_file

if TYPE_CHECKING:
    import numpy as np

__all__ = ["OrtEngine"]


def _fail(msg: str, exc: Exception | None = None, code: ErrorCode = ErrorCode.ENGINE_LOAD_FAILED) -> EngineError:
    text = f"{msg}: {exc}" if exc else msg
    return EngineError(text, code, stage="load_engine", setting="engine / device")


class OrtEngine:
    name = "onnxruntime"
    OPTIONS = ("tensorrt", "prepacking", "intra_op_threads", "spinning", "populate", "trt_cache_dir")

    def __init__(self, pkg, device: str = "auto", *, tensorrt: bool = False, prepacking: bool = False,
                 intra_op_threads: int = 0, spinning: bool = False, populate: bool = False,
                 trt_cache_dir: str | None = None) -> None:
        t0 = time.perf_counter()
        self.lib = lib = load_library()
        providers = lib.available_providers()
        self.device, gpu_providers, device_id = self._resolve(device, providers, tensorrt)
        spec = pkg.manifest.engines.get("onnxruntime", {})
        model_file = spec.get("gpu_file", "model.onnx") if gpu_providers else spec.get("file", "model.ort")
        outputs = [o.name for o in pkg.manifest.outputs]
        # run() passes (input_ids, attention_mask) in this order; the manifest lists them so.
        self._in_names = (c_char_p * 2)(*(i.name.encode() for i in pkg.manifest.inputs[:2]))
        self._out_names = (c_char_p * 1)(outputs[0].encode())
        self._dim = pkg.manifest.output_dim
        self._session, self._opts, self._meminfo = c_void_p(), c_void_p(), c_void_p()
        self._map: MappedFile | None = None
        try:
            self._map = map_file(pkg.path(model_file), populate=populate)
            t_map = time.perf_counter()
            opts = c_void_p()
            lib.call("CreateSessionOptions", byref(opts))
            self._opts = opts
            lib.call("SetSessionLogSeverityLevel", opts, LOGGING_ERROR)
            lib.call("SetIntraOpNumThreads", opts, int(intra_op_threads))  # 0 = one per core
            # ORT's pool threads busy-wait for work by default: burnt power on a Jetson, and
            # stolen cycles from the tokenizer and server threads on a small CPU.
            lib.call("AddSessionConfigEntry", opts, b"session.intra_op.allow_spinning", b"1" if spinning else b"0")
            if gpu_providers:
                lib.call("SetSessionGraphOptimizationLevel", opts, ORT_ENABLE_ALL)
                self._append_gpu(opts, gpu_providers, device_id, trt_cache_dir)
            else:
                # The ORT file is already optimised (build host, level "all"): nothing to redo,
                # and a rewrite would allocate new initializers beside the mapped ones.
                lib.call("SetSessionGraphOptimizationLevel", opts, ORT_DISABLE_ALL)
                lib.call("AddSessionConfigEntry", opts, b"session.use_ort_model_bytes_directly", b"1")
                lib.call("AddSessionConfigEntry", opts, b"session.use_ort_model_bytes_for_initializers", b"1")
                if not prepacking:
                    lib.call("AddSessionConfigEntry", opts, b"session.disable_prepacking", b"1")
            session = c_void_p()
            lib.call("CreateSessionFromArray", lib.env, c_void_p(self._map.address), c_size_t(self._map.size),
                     opts, byref(session))
            self._session = session
            meminfo = c_void_p()
            lib.call("CreateCpuMemoryInfo", ALLOCATOR_ARENA, MEM_TYPE_DEFAULT, byref(meminfo))
            self._meminfo = meminfo
            self._check_io(pkg)
        except OrtError as exc:
            self.close()
            raise _fail(f"ONNX Runtime {lib.version} refused {model_file}", exc) from exc
        except BaseException:
            self.close()
            raise
        if gpu_providers and self._map is not None:
            self._map.close()  # weights live on the device now
            self._map = None
        t1 = time.perf_counter()
        self.info = {
            "file": model_file,
            "providers": gpu_providers + ["CPUExecutionProvider"],
            "library": str(lib.path),
            "version": lib.version,
            "map_ms": (t_map - t0) * 1e3,  # library check + file mapping
            "session_ms": (t1 - t_map) * 1e3,  # session creation on the mapping
            "load_ms": (t1 - t0) * 1e3,
            "options": {"tensorrt": tensorrt, "prepacking": prepacking, "intra_op_threads": intra_op_threads,
                        "spinning": spinning, "populate": populate},
        }

    # -- device choice -------------------------------------------------------------------------

    @staticmethod
    def _resolve(device: str, providers: list[str], tensorrt: bool) -> tuple[str, list[str], int]:
        has_cuda = "CUDAExecutionProvider" in providers
        has_trt = "TensorrtExecutionProvider" in providers
        from edge.engines.device import resolve_device

        device = resolve_device(device, has_cuda)
        if device == "cpu":
            return "cpu", [], 0
        if device == "cuda" or device.startswith("cuda:"):
            if not has_cuda:
                raise _fail(f"device {device!r} asked for, but this ONNX Runtime build offers {providers}",
                            code=ErrorCode.ENGINE_UNAVAILABLE)
            device_id = int(device.split(":", 1)[1]) if ":" in device else 0
            if tensorrt and not has_trt:
                raise _fail(f"tensorrt=True, but this ONNX Runtime build offers {providers}",
                            code=ErrorCode.ENGINE_UNAVAILABLE)
            chosen = (["TensorrtExecutionProvider"] if tensorrt else []) + ["CUDAExecutionProvider"]
            return f"cuda:{device_id}", chosen, device_id
        raise _fail(f"unknown device {device!r}; use 'auto', 'cpu', 'cuda' or 'cuda:N'",
                    code=ErrorCode.ENGINE_UNAVAILABLE)

    def _append_gpu(self, opts: c_void_p, providers: list[str], device_id: int, trt_cache_dir: str | None) -> None:
        lib = self.lib

        def kv(pairs: dict[str, str]):
            keys = (c_char_p * len(pairs))(*(k.encode() for k in pairs))
            vals = (c_char_p * len(pairs))(*(v.encode() for v in pairs.values()))
            return keys, vals, c_size_t(len(pairs))

        # Order of appending is priority: TensorRT first, CUDA for what TensorRT does not take.
        if "TensorrtExecutionProvider" in providers:
            trt = c_void_p()
            lib.call("CreateTensorRTProviderOptions", byref(trt))
            try:
                pairs = {"device_id": str(device_id), "trt_fp16_enable": "0"}
                if trt_cache_dir:
                    pairs.update(trt_engine_cache_enable="1", trt_engine_cache_path=trt_cache_dir,
                                 trt_timing_cache_enable="1", trt_timing_cache_path=trt_cache_dir)
                lib.call("UpdateTensorRTProviderOptions", trt, *kv(pairs))
                lib.call("SessionOptionsAppendExecutionProvider_TensorRT_V2", opts, trt)
            finally:
                lib.release("ReleaseTensorRTProviderOptions", trt)
        cuda = c_void_p()
        lib.call("CreateCUDAProviderOptions", byref(cuda))
        try:
            lib.call("UpdateCUDAProviderOptions", cuda, *kv({"device_id": str(device_id)}))
            lib.call("SessionOptionsAppendExecutionProvider_CUDA_V2", opts, cuda)
        finally:
            lib.release("ReleaseCUDAProviderOptions", cuda)

    def _check_io(self, pkg) -> None:
        lib, n_in, n_out = self.lib, c_size_t(), c_size_t()
        lib.call("SessionGetInputCount", self._session, byref(n_in))
        lib.call("SessionGetOutputCount", self._session, byref(n_out))
        alloc = c_void_p()
        lib.call("GetAllocatorWithDefaultOptions", byref(alloc))

        def names(call: str, n: int) -> list[str]:
            out = []
            for i in range(n):
                p = c_char_p()
                lib.call(call, self._session, c_size_t(i), alloc, byref(p))
                assert p.value is not None  # ORT set it, or lib.call raised
                out.append(p.value.decode())
                lib.call("AllocatorFree", alloc, ctypes.cast(p, c_void_p))
            return out

        got = (names("SessionGetInputName", n_in.value), names("SessionGetOutputName", n_out.value))
        want = ([i.name for i in pkg.manifest.inputs], [o.name for o in pkg.manifest.outputs])
        if sorted(got[0]) != sorted(want[0]) or got[1][:1] != want[1][:1]:
            raise _fail(f"model inputs/outputs {got} differ from the manifest's {want}")

    # -- serving ------------------------------------------------------------------------------

    def _tensor(self, address: int, nbytes: int, shape: tuple[int, ...], elem: int) -> c_void_p:
        dims = (c_int64 * len(shape))(*shape)
        value = c_void_p()
        self.lib.call("CreateTensorWithDataAsOrtValue", self._meminfo, c_void_p(address), c_size_t(nbytes), dims,
                      c_size_t(len(shape)), elem, byref(value))
        return value

    def _run(self, ids_address: int, mask_address: int, out_address: int, batch: int, tokens: int) -> None:
        """One batch: (batch, tokens) int64 ids and mask in, (batch, dim) float32 written to ``out_address``."""
        if not self._session:
            raise RuntimeError("engine is closed")
        n_in = batch * tokens * 8
        values = (c_void_p * 2)()
        result = (c_void_p * 1)()
        try:
            values[0] = self._tensor(ids_address, n_in, (batch, tokens), TENSOR_INT64)
            values[1] = self._tensor(mask_address, n_in, (batch, tokens), TENSOR_INT64)
            result[0] = self._tensor(out_address, batch * self._dim * 4, (batch, self._dim), TENSOR_FLOAT)
            self.lib.call("Run", self._session, None, self._in_names, ctypes.cast(values, POINTER(c_void_p)),
                          c_size_t(2), self._out_names, c_size_t(1), ctypes.cast(result, POINTER(c_void_p)))
        finally:
            for v in (*values, *result):
                self.lib.release("ReleaseValue", v)

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        import numpy as np  # not at module level: see edge/engines/__init__.py

        ids, mask = check_batch(input_ids, attention_mask)
        out = np.empty((ids.shape[0], self._dim), dtype=np.float32)  # ORT writes here directly
        self._run(ids.ctypes.data, mask.ctypes.data, out.ctypes.data, ids.shape[0], ids.shape[1])
        return out

    def warm_run(self, batch: int, tokens: int, ids: list[int]) -> bool:
        """Run one (batch, tokens) batch of ``ids`` (left-aligned, zero padding) without numpy.

        Boot warms the session with this while its main thread is still importing numpy.
        True when every output value is finite.
        """
        row: list[c_int64 | int] = list(ids[:tokens])  # the element type ctypes' slice assignment takes
        flat_ids = (c_int64 * (batch * tokens))()
        flat_mask = (c_int64 * (batch * tokens))()
        for r in range(batch):
            flat_ids[r * tokens : r * tokens + len(row)] = row
            flat_mask[r * tokens : r * tokens + len(row)] = [1] * len(row)
        out = (ctypes.c_float * (batch * self._dim))()
        self._run(ctypes.addressof(flat_ids), ctypes.addressof(flat_mask), ctypes.addressof(out), batch, tokens)
        return all(math.isfinite(v) for v in out)

    def close(self) -> None:
        lib = getattr(self, "lib", None)
        if lib is not None:
            lib.release("ReleaseSession", self._session)
            lib.release("ReleaseSessionOptions", self._opts)
            lib.release("ReleaseMemoryInfo", self._meminfo)
        self._session, self._opts, self._meminfo = c_void_p(), c_void_p(), c_void_p()
        if self._map is not None:
            self._map.close()  # only after the session that reads it is gone
            self._map = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

