"""The engine's chain of boot stages, on threads beside the main thread's imports.

Split in two at the device: :meth:`EngineChain.prepare` (hash the engine's files, import its
library, choose the device) and the device stages (load the engine, prewarm the device, warm
up every shape, preallocate). A boot that stops at the snapshot point on CUDA runs only the
first part before the checkpoint, since no CUDA call may come before it (``edge/runtime/snapshot.py``),
and the device stages after the restore, on the main thread (:meth:`EngineChain.finish`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge.errors import BootError
from edge.runtime.stages import Handoff, Stages, Task, stage_error

if TYPE_CHECKING:
    from edge.engines.base import Engine
    from edge.serving.shapes import BatchShapes

__all__ = ["EngineChain", "VERIFY_SETTING", "verify_package", "verify_gpu_files"]

VERIFY_SETTING = "--package DIR (rebuild or re-copy it) or --verify size"


def verify_package(pkg, names: list[str]) -> None:
    """sha256 of ``names`` against the manifest, before any parser maps them."""
    pkg.verify_files(names)


def verify_gpu_files(pkg, names: list[str]) -> None:
    """sha256 of the files only the GPU path reads (ORT's model.onnx), once CUDA is chosen."""
    pkg.verify_files(names)


class EngineChain:
    """The engine's stages, on threads beside the main thread's imports::

        ┬─ verify_package ─┬─ load_engine ─ prewarm_device ─ warm_buckets ─ preallocate
        └─ import_engine ──┘

    Everything heavy here runs without the GIL: hashlib over a mapping, ONNX Runtime's C
    calls through ctypes (library set-up, session creation, the warm-up batches), torch's
    kernels. The main thread's imports hold the GIL, so the chains share the cores instead
    of queueing on one. Loading the library parses no package file, so it runs beside the
    hashing; the session is created only once the hashes match.

    ``import torch`` is the exception: it holds the GIL for seconds, so the main thread
    runs it first and hands the library over (``MAIN_THREAD_IMPORT``); interleaved with the
    main thread's other imports it ran 10-25 % slower here.

    The warm-up waits for neither numpy nor the tokenizer: ONNX Runtime warms on its own
    native inputs, and the input comes tokenized in the package (``serving.warm_sample_ids``).
    For an older package without it, the main thread hands the tokenizer over.
    """

    MAIN_THREAD_IMPORT = frozenset({"torchscript"})

    def __init__(self, stages: Stages, args, pkg, tokenizer: Handoff, *, stop_before_cuda: bool = False) -> None:
        """``stop_before_cuda``: on a CUDA device, end the chain before its first CUDA call
        (the snapshot point); :meth:`finish` runs the device stages later."""
        self._stages, self._args, self._pkg, self._tokenizer = stages, args, pkg, tokenizer
        self._stop_before_cuda = stop_before_cuda
        self.engine: Engine | None = None
        self.buffers: dict | None = None
        self.shapes: BatchShapes | None = None
        self.device: str | None = None
        self.warm: dict | None = None  # warm_buckets' record: its fastest_ms is the breaker's yardstick
        self.library = Handoff() if args.engine in self.MAIN_THREAD_IMPORT else None
        self._task = Task("engine", self._chain)

    @property
    def pending(self) -> bool:
        """The device stages are still to run (:meth:`finish`)."""
        return self.device is not None and self.engine is None

    def _chain(self) -> None:
        self.device = self._prepare()
        if not (self._stop_before_cuda and self.device != "cpu"):
            self._device_stages(self._stages, self.device)

    def finish(self, stages: Stages):
        """The device stages, on this thread, after a restore; returns what :meth:`result` does."""
        if self.device == "auto":
            self.device = self._resolve(stages.run, "auto")
        assert self.device is not None  # the chain's first part chose it (pending)
        self._device_stages(stages, self.device, overlapped=False)
        return self.engine, self.shapes, self.buffers

    def _prepare(self) -> str:
        """Hash the engine's files, import its library, choose the device; returns the device."""
        run, args, pkg = self._stages.run, self._args, self._pkg
        from edge.engines.device import device_kind
        from edge.engines import import_engine

        # Hash the engine's files before any parser sees them: a corrupt file must be refused
        # by name, not crash a native library. Which files depends on the device, known only
        # once the library is loaded: "auto" starts with the CPU's and adds the GPU's if needed.
        verified = set(pkg.engine_files(args.engine, device_kind(args.device)))
        verify = None
        if args.verify == "full":
            verify = Task("verify", lambda: run(verify_package, pkg, sorted(verified), setting=VERIFY_SETTING,
                                                overlapped=True))
        try:
            if self.library is not None:
                backend = self.library.get()
            else:
                backend = run(import_engine, args.engine, setting="--engine", engine=args.engine, overlapped=True)
        finally:
            if verify is not None:
                verify.result()  # a bad file is the error to report, even if the library failed too
        self._backend, self._verified = backend, verified
        if self._stop_before_cuda and args.device == "auto" and args.engine != "onnxruntime":
            return "auto"  # torch.cuda.is_available() initializes CUDA: asked after the restore
        return self._resolve(run, args.device)

    def _resolve(self, run, requested: str) -> str:
        """The device (``auto`` resolved), with the GPU-only files hashed once CUDA is chosen."""
        from edge.engines.device import cuda_available, device_kind, resolve_device

        args, pkg = self._args, self._pkg
        device = resolve_device(requested, cuda_available(args.engine, self._backend))
        extra = sorted(set(pkg.engine_files(args.engine, device_kind(device))) - self._verified)
        if extra and args.verify == "full":
            run(verify_gpu_files, pkg, extra, setting=VERIFY_SETTING, overlapped=True)
        return device

    def _device_stages(self, stages: Stages, device: str, overlapped: bool = True) -> None:
        """Load the engine on ``device``, prewarm it, warm up every shape, preallocate."""
        run, args, pkg = stages.run, self._args, self._pkg
        from edge import warmup
        from edge.engines.device import device_kind
        from edge.engines import load_engine
        from edge.serving.shapes import BatchShapes

        engine = run(load_engine, pkg, args.engine, device, setting="--engine / --device", overlapped=overlapped)
        self.engine = engine

        manifest = pkg.manifest
        shapes = BatchShapes(manifest.serving, max_seq_length=manifest.max_seq_length,
                             kind=device_kind(engine.device))
        run(warmup.prewarm_device, engine, args.cuda_reserve_mb, setting="--device / --cuda-reserve-mb",
            overlapped=overlapped)
        sample = manifest.serving.warm_sample_ids
        if sample is None:  # a package from before the builder stored them
            sample = self._tokenizer.get().encode(warmup.WARM_TEXT, max_length=shapes.buckets[-1]).ids
        # ONNX Runtime warms on its own native inputs (no numpy, which the main thread may
        # still be importing); the buffers come after. Other engines warm through them
        # (pinned host memory on CUDA). Padding is the engine loop's, per batch.
        native = hasattr(engine, "warm_run")
        allocate = lambda: run(warmup.preallocate, shapes, engine,  # noqa: E731
                               setting="serving.max_batch_size in the package", overlapped=overlapped)
        buffers = None if native else allocate()
        self.warm = run(warmup.warm_buckets, engine, shapes, sample, buffers, setting="serving.warm in the package",
            shapes=len(shapes.warm_shapes()), repeats=shapes.warm_repeats, overlapped=overlapped)
        self.buffers = allocate() if native else buffers
        self.shapes = shapes

    def result(self):
        """(engine, shapes, buffers) once every stage is done; re-raises a failure as a BootError."""
        try:
            self._task.result()
        except BaseException as exc:
            if isinstance(exc, BootError) and exc.stage:
                raise
            err = stage_error("engine", exc, "--engine / --package DIR")  # outside any stage
            if err is exc:
                raise
            raise err from exc
        return self.engine, self.shapes, self.buffers

    def settle(self, timeout_s: float = 30.0) -> None:
        """After a main-thread failure: let the chain leave its native call before we exit.

        It stops at the tokenizer handoff (cancelled by the caller) or at its end; exiting
        while it is inside ONNX Runtime or torch could crash the interpreter's teardown and
        hide the error we report.
        """
        self._task.join(timeout_s)
        if self.engine is not None and not self._task.is_alive():
            self.engine.close()


