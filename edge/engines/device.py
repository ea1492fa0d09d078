"""Where the engine runs: the one place that decides between the CPU and CUDA.

:func:`resolve_device` turns the ``--device`` setting ("auto", "cpu", "cuda", "cuda:N") into
the device the engine is loaded on; both engines call it (with :func:`cuda_available`'s answer), and boot calls it once, after the
engine's library is loaded, so every later step sees the same answer. :func:`device_kind`
reduces a device to "cpu" or "cuda", the key of the warm-up and padding settings.
Standard library only; nothing here imports torch or ONNX Runtime.
"""

from __future__ import annotations

__all__ = ["cuda_available", "resolve_device", "device_kind"]


def cuda_available(engine: str, backend) -> bool:
    """Does ``backend`` (what :func:`edge.engines.import_engine` returned) see a CUDA device?"""
    if engine == "onnxruntime":
        return "CUDAExecutionProvider" in backend.available_providers()
    return bool(backend.cuda.is_available())


def resolve_device(requested: str, cuda_present: bool) -> str:
    """``requested`` with "auto" resolved: "cuda" when the engine's library sees CUDA, else "cpu".

    An explicit "cpu", "cuda" or "cuda:N" is returned as is; the engine checks that it exists.
    """
    if requested == "auto":
        return "cuda" if cuda_present else "cpu"
    return requested


def device_kind(device: str) -> str:
    """"cuda" for "cuda" and "cuda:N", else "cpu" ("auto" counts as the CPU until resolved)."""
    return "cuda" if str(device).startswith("cuda") else "cpu"
