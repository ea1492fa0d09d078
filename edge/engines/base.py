"""The engine interface every engine implements, the engines' names, and the batch check they share.

Separate from the package's ``__init__`` (which chooses and loads an engine) so that an engine
module imports its interface without importing the chooser that imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Engine", "ENGINE_NAMES", "check_batch"]

ENGINE_NAMES = ("onnxruntime", "torchscript")


@runtime_checkable
class Engine(Protocol):
    name: str  # "onnxruntime" | "torchscript"
    device: str  # "cpu" | "cuda:0"
    info: dict  # how it was loaded: files, providers, map/session times (ms), options

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """(B, T) int64 each -> (B, D) float32, L2-normalised rows."""
        ...

    def close(self) -> None:
        """Release the session/module and unmap the files. Idempotent."""
        ...


def check_batch(input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both as C-contiguous int64 (B, T) arrays of the same shape (no copy when they already are)."""
    import numpy as np

    ids = np.ascontiguousarray(input_ids, dtype=np.int64)
    mask = np.ascontiguousarray(attention_mask, dtype=np.int64)
    if ids.ndim != 2 or ids.shape != mask.shape or ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(f"input_ids {ids.shape} and attention_mask {mask.shape} must be the same non-empty (B, T)")
    return ids, mask
