"""The engine's chain of boot stages, on threads beside the main thread's imports.

Split in two at the device: :meth:`EngineChain.prepare` (import the engine's library, choose
the device) and the device stages (load the engine, prewarm the device, warm up every shape,
preallocate). A boot that stops at the snapshot point on CUDA runs only the first part before
the checkpoint, since no CUDA call may come before it (``edge/runtime/snapshot.py``), and the
device stages after the restore, on the main thread (:meth:`EngineChain.finish`).

The hashes of the engine's files are checked by the boot's threads as they come free (by chunks,
shared among them, where the manifest has the files' chunk digests), beside the whole chain:
the engine loads and warms while its files are still being hashed, and :meth:`EngineChain.result`,
which the boot passes before it binds, waits for both and refuses the boot when a hash failed.
No reply can come from weights whose hash has not matched: nothing binds before it has.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge.errors import BootError
from edge.runtime.stages import Handoff, Job, Stages, Task, stage_error

if TYPE_CHECKING:
    from edge.engines.base import Engine
    from edge.preload.manifest import ModelPackage
    from edge.serving.shapes import BatchShapes

__all__ = ["EngineChain", "VERIFY_SETTING", "engine_options", "warm_plan", "verify_package", "verify_gpu_files",
           "verified_by"]

VERIFY_SETTING = "--package DIR (rebuild or re-copy it) or --verify size"


def verify_package(check) -> dict[str, str]:
    """The content of the engine's files against the manifest (a :class:`ContentCheck`): {name:
    "fsverity" | "sha256"}, how each was checked (the kernel's fs-verity digest where the file has
    the manifest's, else its sha256, by chunks where the manifest has them)."""
    return check.run()


def verify_gpu_files(check) -> dict[str, str]:
    """:func:`verify_package` for the files only the GPU path reads (ORT's model.onnx), once CUDA is chosen."""
    return check.run()


def spare_cpus() -> int:
    """Threads that can hash from the start of the boot beside the main thread and the engine's:
    the CPUs this process may run on less those two, at most 3. None on a 2-core device, where a
    third thread only took the warm-up's CPU (measured: see EngineChain)."""
    import os

    return max(0, min(3, len(os.sched_getaffinity(0)) - 2))


def engine_options(args, device: str) -> dict:
    """The engine's load options from ``edge serve``'s flags. ONNX Runtime's weight prepacking on a
    CPU (``--ort-prepacking``): packed copies of the weights make every matrix product faster, but
    they are made at load (a fresh boot's critical path) and take anonymous memory. ``auto`` turns
    it on where the boot stops at the snapshot point: there the packing is paid once, when the
    snapshot is taken, and every restore starts with it (docs/snapshot.md). A GPU's session
    packs nothing for the CPU: no option there."""
    if args.engine != "onnxruntime" or device.startswith("cuda"):
        return {}
    choice = args.ort_prepacking
    return {"prepacking": choice == "on" or (choice == "auto" and bool(args.snapshot_point))}


def warm_plan(args, shapes: BatchShapes, *, kind: str | None = None,
              in_snapshot: bool | None = None) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(shapes warmed before READY, shapes the engine loop warms once READY, when idle), by
    ``edge serve --warm-up``. ``kind``: the device kind of the engine warmed (default: the
    shapes'); ``in_snapshot``: whether this warm-up runs before the checkpoint (default: the boot
    stops at the snapshot point; the fallback's never does, edge/runtime/fallback.py).

    On a CPU a shape's first run costs what its later runs do: ONNX Runtime and TorchScript
    compile nothing per shape (measured here, MiniLM: 1x256 first 44-57 ms, then 39-53; 8x128
    first 137-166, then 131-147). Only the first run of all pays a set-up (thread pool, arena:
    +5-40 ms). So ``deferred`` runs the smallest shape before READY, which pays that set-up and
    proves the engine's output sound, and leaves the other shapes, whose runs only give the
    breaker its yardstick per shape (edge/serving/engine_cost.py), to the idle engine: about
    170 ms of a 300 ms boot here. ``auto`` defers on a fresh CPU boot only: where the boot
    stops at the snapshot point the warm-up is paid once, before the checkpoint, and on CUDA
    graphs and TensorRT profiles exist only for warmed shapes (and cuDNN tunes per shape), so
    every shape runs before READY there, whatever the flag says."""
    plan = shapes.warm_shapes()  # largest first
    choice = getattr(args, "warm_up", "full")
    in_snapshot = bool(args.snapshot_point) if in_snapshot is None else in_snapshot
    defer = (kind or shapes.kind) == "cpu" and (choice == "deferred" or (choice == "auto" and not in_snapshot))
    if not defer or len(plan) < 2:
        return plan, []
    return plan[-1:], plan[-2::-1]  # the smallest now; the rest smallest first, so a request waits the least


def verified_by(checked: dict[str, str], threads: int = 0) -> dict:
    """A verify stage's note in the timeline: how each file was checked, and (``threads``) how
    many threads shared the chunks, where the files were hashed by chunks."""
    return {"verified_by": checked, **({"threads": threads} if threads else {})}


class EngineChain:
    """The engine's stages, on threads beside the main thread's imports::

        engine: import_engine ─ load_engine ─ prewarm_device ─ warm_buckets ─ preallocate ─ (verify_package) ─┬─ result()
        main:   ... imports ─ verify_package (if the engine's thread has not taken it) ───────────────────┘

    Everything heavy here runs without the GIL: hashlib over a mapping, ONNX Runtime's C
    calls through ctypes (library set-up, session creation, the warm-up batches), torch's
    kernels. The main thread's imports hold the GIL, so the chains share the cores instead
    of queueing on one.

    The session does not wait for the hashes (about 90 MB of ``model.ort``: 70-180 ms here,
    which put the whole warm-up behind them). It is created and warmed on the file as it is;
    :meth:`result` joins the hashing and raises its error first, whatever the engine did (a
    corrupt file is refused by name, even when the engine refused it too), and the boot binds
    only after :meth:`result`. The chain stops between its stages once a hash has failed.

    Who hashes: the first boot thread with nothing else to do (:meth:`verify_here`), usually the
    engine's after its warm-up (or while it waits for ``import torch``), else the main thread once
    its imports are done; and where the manifest has the files' ``sha256_chunks``, every other
    thread that comes free takes chunks too (``edge/preload/chunks.py``), so the two threads of a
    2-core device finish the hash together. With more than two CPUs, :func:`spare_cpus` threads
    hash chunks from the moment the package is open. Not a third thread from the start on two
    cores: ONNX Runtime's warm-up runs a thread per core, so a hash beside it takes its CPU.
    Measured here (2 cores, medians of 30 runs): with the hash on its own thread warm_buckets took
    342 ms instead of 233 and READY came 21 ms later than with the old order (hash, then load);
    hashed by the first free thread, READY came 31 ms sooner than with the old order (paired
    runs). The GPU-only files are hashed on a thread of their own at once: a GPU's load and
    warm-up leave the CPU idle.
    ONNX Runtime verifies an ORT file's flatbuffer before it reads it: of 40 copies of
    ``model.ort`` with 8 random bytes changed (in its head, its tail or anywhere), each was
    refused by ``load_engine`` or ran, none crashed the process. Where the manifest gives
    fs-verity digests and the installer enabled it, "hashing" is the kernel's measured digest
    (microseconds, ``edge/preload/verity.py``); the stage's ``verified_by`` says which.

    ``import torch`` is the exception: it holds the GIL for seconds, so the main thread
    runs it first and hands the library over (``MAIN_THREAD_IMPORT``); interleaved with the
    main thread's other imports it ran 10-25 % slower here.

    The warm-up waits for neither numpy nor the tokenizer: ONNX Runtime warms on its own
    native inputs, and the input comes tokenized in the package (``serving.warm_sample_ids``).
    For an older package without it, the main thread hands the tokenizer over.
    """

    MAIN_THREAD_IMPORT = frozenset({"torchscript"})

    def __init__(self, stages: Stages, args, tokenizer: Handoff, *, stop_before_cuda: bool = False) -> None:
        """Starts the engine's thread, which imports the library at once; the package comes
        later (:meth:`open`). ``stop_before_cuda``: on a CUDA device, end the chain before its
        first CUDA call (the snapshot point); :meth:`finish` runs the device stages later."""
        self._stages, self._args, self._tokenizer = stages, args, tokenizer
        self._stop_before_cuda = stop_before_cuda
        self._pkg: ModelPackage = None  # type: ignore[assignment]  # set by open(), before the chain reads it
        self.engine: Engine | None = None
        self.buffers: dict | None = None
        self.shapes: BatchShapes | None = None
        self.device: str | None = None
        self.warm: dict | None = None  # warm_buckets' record: its fastest_ms is the breaker's yardstick
        self.warm_later: list[tuple[int, int]] = []  # shapes the engine loop warms after READY (warm_plan)
        self.library = Handoff() if args.engine in self.MAIN_THREAD_IMPORT else None
        self.package = Handoff()  # the opened package, from the main thread (:meth:`open`)
        self._verified: set[str] = set()  # the files a verify task hashes (or, with --verify size, would)
        self._verifies: list[Job] = []
        self._cancelled = False  # the main thread failed: stop (cancel())
        # Started before the package is read: loading the library needs no package file, so it
        # runs beside the manifest's import, its reading and its checks (5-15 ms here).
        self._task = Task("engine", self._chain)

    def open(self, pkg) -> None:
        """Hand the opened package over, and queue the hashing of the files the engine maps.

        Which files depends on the device, known only once the library is loaded: "auto" starts
        with the CPU's and adds the GPU's if CUDA is chosen (:meth:`_resolve`).
        """
        from edge.engines.device import device_kind

        self._pkg = pkg
        cpu_files = pkg.engine_files(self._args.engine, device_kind(self._args.device))
        self._verified.update(cpu_files)  # before the engine's thread can add the GPU's
        self.package.put(pkg)
        job = self._verify(cpu_files, lambda run, check: run(verify_package, check, **_verify_stage(check)), force=True)
        if job is not None:
            for _ in range(spare_cpus()):
                Task("verify-helper", job.take_or_help)  # started at once

    def cancel(self) -> None:
        """After a main-thread failure: the handoffs the engine's thread may wait on will not come,
        no hash is to start, and the chain stops before its next stage."""
        self._cancelled = True
        self.package.cancel()
        if self.library is not None:
            self.library.cancel()
        for job in list(self._verifies):
            job.drop()

    @property
    def pending(self) -> bool:
        """The device stages are still to run (:meth:`finish`)."""
        return self.device is not None and self.engine is None

    def _verify(self, names, stage, force: bool = False, beside: bool = False) -> Job | None:
        """The check of the ``names`` not yet handed to one, or (``force``) all of them, as a job
        that runs ``stage(the boot's stage runner, the check)``: taken by the first boot thread with
        nothing else to do, and helped by the others (:meth:`verify_here`), or (``beside``) run at
        once on a thread of its own."""
        names = sorted(set(names) if force else set(names) - self._verified)
        self._verified.update(names)
        if not (names and self._args.verify == "full" and not self._cancelled):
            return None
        check = self._pkg.content_check(names)
        job = Job("verify", lambda: stage(self._stages.run, check), helper=check.help)
        self._verifies.append(job)
        if beside:
            job.start()
        return job

    def verify_here(self) -> None:
        """Hash here what no thread has taken yet, or help the thread that has (a thread with its
        own stages done)."""
        for job in list(self._verifies):
            job.take_or_help()

    def _unless_refused(self) -> None:
        """Between the engine's stages: stop once a hash has failed (:meth:`result` reports it) or
        the main thread has (:meth:`cancel`)."""
        if self._cancelled or any(job.error is not None for job in self._verifies):
            raise _HashFailed()

    def _join_verified(self) -> None:
        """Wait for every hash, taking on this thread any no other thread has; raise the first
        failure (a BootError of its stage, naming the file)."""
        for job in list(self._verifies):
            job.take_or_help()
            job.result()

    def _chain(self) -> None:
        self.device = self._prepare()
        if not (self._stop_before_cuda and self.device != "cpu"):
            self._device_stages(self._stages, self.device)
        self.verify_here()  # done before the main thread: hash what it has not taken

    def finish(self, stages: Stages):
        """The device stages, on this thread, after a restore; returns what :meth:`result` does."""
        if self.device == "auto":
            self.device = self._resolve(stages.run, "auto")
        assert self.device is not None  # the chain's first part chose it (pending)
        try:
            self._device_stages(stages, self.device, overlapped=False)
        finally:
            self._join_verified()  # a bad file is the error to report, even if the engine failed too
        return self.engine, self.shapes, self.buffers

    def _prepare(self) -> str:
        """Import the engine's library, choose the device; returns the device."""
        run, args = self._stages.run, self._args
        from edge.engines import import_engine

        if self.library is not None:
            self.package.get()
            self.verify_here()  # while the main thread imports torch (seconds), this one has nothing to do
            backend = self.library.get()
        else:
            backend = run(import_engine, args.engine, setting="--engine", engine=args.engine, overlapped=True)
        self._backend = backend
        self.package.get()  # opened and checked by the main thread: the rest reads it
        if self._stop_before_cuda and args.device == "auto" and args.engine != "onnxruntime":
            return "auto"  # torch.cuda.is_available() initializes CUDA: asked after the restore
        return self._resolve(run, args.device)

    def _resolve(self, run, requested: str) -> str:
        """The device (``auto`` resolved); the GPU-only files handed to a verify task once CUDA is chosen."""
        from edge.engines.device import cuda_available, device_kind, resolve_device

        device = resolve_device(requested, cuda_available(self._args.engine, self._backend))
        # Beside, at once: a GPU's load and warm-up leave the CPU mostly idle, and the main thread
        # may be waiting already, past its own verify_here().
        self._verify(self._pkg.engine_files(self._args.engine, device_kind(device)),
                     lambda _, check: run(verify_gpu_files, check, **_verify_stage(check)), beside=True)
        return device

    def _device_stages(self, stages: Stages, device: str, overlapped: bool = True) -> None:
        """Load the engine on ``device``, prewarm it, warm up every shape, preallocate."""
        run, args, pkg = stages.run, self._args, self._pkg
        from edge import warmup
        from edge.engines.device import device_kind
        from edge.engines import load_engine
        from edge.serving.shapes import BatchShapes

        self._unless_refused()
        options = engine_options(args, device)
        engine = run(load_engine, pkg, args.engine, device, kwargs=options, setting="--engine / --device / --ort-prepacking",
                     overlapped=overlapped, **options)
        self.engine = engine

        manifest = pkg.manifest
        shapes = BatchShapes(manifest.serving, max_seq_length=manifest.max_seq_length,
                             kind=device_kind(engine.device))
        self._unless_refused()
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
        self._unless_refused()
        now, self.warm_later = warm_plan(args, shapes)
        self.warm = run(warmup.warm_buckets, engine, shapes, sample, buffers, kwargs={"plan": now},
                        setting="serving.warm in the package, --warm-up", shapes=len(now),
                        deferred=[f"{r}x{t}" for r, t in self.warm_later], repeats=shapes.warm_repeats,
                        overlapped=overlapped)
        self.buffers = allocate() if native else buffers
        self.shapes = shapes

    def result(self):
        """(engine, shapes, buffers) once every stage is done and every hash has matched; re-raises
        a failure as a BootError, a hash's before the engine's."""
        try:
            try:
                self._task.join()
            finally:
                self._join_verified()  # a bad file is the error to report, even if the engine failed too
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
        for job in self._verifies:  # hashlib over a mapping: unmapped at exit under a live hash otherwise
            job.drop()
            try:
                job.result(timeout_s)
            except BaseException:  # noqa: BLE001 - the main thread's error is the one reported
                pass
        if self.engine is not None and not self._task.is_alive():
            self.engine.close()


def _verify_stage(check) -> dict:
    """A verify stage's options: what to change if it fails, and its note (how each file was
    checked, and by how many threads)."""
    return {"setting": VERIFY_SETTING, "overlapped": True, "note": lambda checked: verified_by(checked, check.threads)}


class _HashFailed(Exception):
    """A hash failed (or the main thread did) while the engine's chain ran: it stops; what is
    reported is the hash's own error (:meth:`EngineChain.result`) or the main thread's."""


