"""TorchScript engine: a weightless scripted skeleton plus mapped weights.

``torch.jit.load`` has no mmap option and copies every weight into anonymous memory
(+88 MiB for MiniLM). The package therefore stores a skeleton whose weight buffers are
empty (``model.ts``, ~30 KB) and the weights in ``weights.safetensors`` (64-byte aligned).
The engine maps the safetensors file copy-on-write (:func:`edge.preload.weights.map_weights`),
wraps each tensor with ``torch.from_numpy`` (no copy) and assigns it to its buffer.

On CUDA the tensors are copied to the device once and the mapping is dropped.
TorchScript's profiling executor needs 2-3 calls per shape to reach steady speed; warm-up
runs each bucket shape at least three times.
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from edge.engines.base import check_batch
from edge.errors import EngineError, ErrorCode
from edge.preload.weights import WeightMap, map_weights

__all__ = ["TorchScriptEngine"]


def _import_torch():
    try:
        import torch
    except ImportError as exc:
        raise EngineError("torch is not installed", ErrorCode.ENGINE_UNAVAILABLE, stage="load_engine",
                          setting="pip install 'edge[torch]' (NVIDIA's JetPack wheel on a Jetson), or --engine onnxruntime") from exc
    return torch


class TorchScriptEngine:
    name = "torchscript"
    OPTIONS = ("threads", "profiling")

    def __init__(self, pkg, device: str = "auto", *, threads: int = 0, profiling: bool | None = None) -> None:
        t0 = time.perf_counter()
        torch = self._torch = _import_torch()
        t_import = time.perf_counter()
        self.device = self._resolve(torch, device)
        if threads:
            torch.set_num_threads(int(threads))
        # TorchScript's profiling executor re-optimises each new input shape
        # over its first calls; it pays off where a fuser runs (CUDA). On the
        # CPU there is no fuser, and the legacy executor is faster both on
        # the first call and in steady state (MiniLM 1x256: 111 vs 198 ms
        # first call, 58 vs 76 ms steady; measured here). Process-wide switch.
        self._profiling = (self.device != "cpu") if profiling is None else bool(profiling)
        if hasattr(torch._C, "_jit_set_profiling_executor"):
            torch._C._jit_set_profiling_executor(self._profiling)
        spec = pkg.manifest.engines.get("torchscript", {})
        model_file = spec.get("file", "model.ts")
        weights_file = spec.get("weights", "weights.safetensors")
        self._module = None
        self._weights: WeightMap | None = map_weights(pkg.path(weights_file), alignment=64)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.load still works, and maps
                module = torch.jit.load(str(pkg.path(model_file)), map_location="cpu")
            target = torch.device(self.device)
            for name, array in self._weights.tensors.items():
                tensor = torch.from_numpy(array)  # a view of the mapping: no copy
                if target.type != "cpu":
                    tensor = tensor.to(target)
                *path, leaf = name.split(".")
                owner = module
                for part in path:
                    owner = getattr(owner, part)
                setattr(owner, leaf, tensor)
            self._module = module.eval()
        except EngineError:
            raise
        except Exception as exc:
            self.close()
            raise EngineError(f"TorchScript refused {model_file} / {weights_file}: {exc}", ErrorCode.ENGINE_LOAD_FAILED,
                              stage="load_engine", setting="engine") from exc
        if self.device != "cpu":
            self._weights.close()  # the device holds its own copy now
            self._weights = None
        self._dim = pkg.manifest.output_dim
        t1 = time.perf_counter()
        self.info = {
            "file": model_file,
            "weights": weights_file,
            "torch": torch.__version__,
            "import_ms": (t_import - t0) * 1e3,
            "map_ms": (t1 - t_import) * 1e3,  # skeleton load + weight mapping + assignment
            "load_ms": (t1 - t0) * 1e3,
            "options": {"threads": threads, "profiling": self._profiling},
        }

    @staticmethod
    def _resolve(torch, device: str) -> str:
        from edge.engines.device import resolve_device

        device = resolve_device(device, torch.cuda.is_available())
        if device == "cpu":
            return "cpu"
        if device == "cuda" or device.startswith("cuda:"):
            if not torch.cuda.is_available():
                raise EngineError(f"device {device!r} asked for, but torch {torch.__version__} sees no CUDA device",
                                  ErrorCode.ENGINE_UNAVAILABLE, stage="load_engine", setting="device")
            index = int(device.split(":", 1)[1]) if ":" in device else 0
            if index >= torch.cuda.device_count():
                raise EngineError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s)",
                                  ErrorCode.ENGINE_UNAVAILABLE, stage="load_engine", setting="device")
            return f"cuda:{index}"
        raise EngineError(f"unknown device {device!r}; use 'auto', 'cpu', 'cuda' or 'cuda:N'",
                          ErrorCode.ENGINE_UNAVAILABLE, stage="load_engine", setting="device")

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        if self._module is None:
            raise RuntimeError("engine is closed")
        torch = self._torch
        ids, mask = check_batch(input_ids, attention_mask)
        with torch.inference_mode():
            t_ids = torch.from_numpy(ids)
            t_mask = torch.from_numpy(mask)
            if self.device != "cpu":
                t_ids = t_ids.to(self.device, non_blocking=True)
                t_mask = t_mask.to(self.device, non_blocking=True)
            out = self._module(t_ids, t_mask)  # (B, D)
            if self.device != "cpu":
                out = out.cpu()  # synchronises the stream
            return out.numpy().astype(np.float32, copy=False)

    def close(self) -> None:
        self._module = None
        weights = getattr(self, "_weights", None)  # unset when __init__ failed before mapping them
        if weights is not None:
            weights.close()
            self._weights = None
