"""Engines: load a model package, run a padded batch, return embeddings.

One narrow interface (:class:`Engine`) and two implementations, chosen by name:

* ``"torchscript"``: the weightless TorchScript skeleton with weights assigned from a
  copy-on-write mapping of ``weights.safetensors`` (``edge/engines/torchscript.py``);
* ``"onnxruntime"``: ``model.ort`` mapped read-only and run in place through ONNX Runtime's
  C API (``edge/engines/ort.py``).

``torch`` and ``onnxruntime`` are imported inside :func:`load_engine`, never when this
package is imported, so a process pays only for the engine it uses. numpy is not imported
here or by the ONNX Runtime engine until it runs a batch: boot loads the library and creates
the session on one core while the other is still importing numpy.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from edge.engines.base import ENGINE_NAMES, Engine, check_batch
from edge.errors import EngineError, ErrorCode

if TYPE_CHECKING:
    from edge.engines.ort import OrtEngine
    from edge.engines.torchscript import TorchScriptEngine
    from edge.preload.manifest import ModelPackage

__all__ = ["Engine", "ENGINE_NAMES", "import_engine", "load_engine", "check_batch"]

def _unknown(name: str) -> EngineError:
    return EngineError(
        f"unknown engine {name!r}; choose one of {', '.join(ENGINE_NAMES)}",
        ErrorCode.ENGINE_UNAVAILABLE,
        stage="load_engine",
        setting="engine",
    )


def import_engine(name: str):
    """Load engine ``name``'s library, the part of loading that no package changes.

    ``torchscript``: ``import torch`` (2-4 s). ``onnxruntime``: load and check the C library
    and create the process-wide OrtEnv (tens of ms). :func:`load_engine` calls it too; a boot
    that calls it first can time (or overlap) it as its own stage.
    """
    if name == "onnxruntime":
        from edge.engines.ort_capi import load_library

        return load_library()
    if name == "torchscript":
        from edge.engines.torchscript import _import_torch

        return _import_torch()
    raise _unknown(name)


def load_engine(
    package: "ModelPackage | str | os.PathLike", name: str = "onnxruntime", device: str = "auto", **options
) -> Engine:
    """Load ``package`` (a :class:`ModelPackage` or a package directory) into engine ``name``.

    ``device``: ``"auto"`` (CUDA when the engine sees it, else CPU), ``"cpu"``, ``"cuda"`` or
    ``"cuda:N"``. ``options`` are engine settings (see each engine's ``OPTIONS``); an unknown
    option is an error. Raises :class:`edge.errors.EngineError` (``ENGINE_UNAVAILABLE`` when the
    library or device is missing, ``ENGINE_LOAD_FAILED`` when it refuses the model) or
    :class:`edge.errors.PackageError` for a bad package.
    """
    from edge.preload.manifest import ModelPackage, open_package

    pkg = package if isinstance(package, ModelPackage) else open_package(package, verify="size", engine=name)
    cls: type[OrtEngine | TorchScriptEngine]
    if name == "onnxruntime":
        from edge.engines.ort import OrtEngine as cls
    elif name == "torchscript":
        from edge.engines.torchscript import TorchScriptEngine as cls
    else:
        raise _unknown(name)
    unknown = set(options) - set(cls.OPTIONS)
    if unknown:
        raise EngineError(
            f"unknown option(s) for engine {name}: {', '.join(sorted(unknown))}; known: {', '.join(cls.OPTIONS)}",
            ErrorCode.ENGINE_LOAD_FAILED,
            stage="load_engine",
            setting="engine options",
        )
    return cls(pkg, device=device, **options)
