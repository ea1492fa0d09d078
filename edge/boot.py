"""``python -m edge.boot``: boot the runtime to READY, then serve until SIGTERM.

The stages, each named in the timeline after the function it runs (grep the name)::

    main:    interpreter ─ import_manifest ─ open_package ─ select_engine ─┬─ import_tokenizer ─ verify_tokenizer ─ load_tokenizer ─ import_server ─ prepare_tokenizer ─┬─ bind ─ start ─ READY
    engine:                                                                ├─ verify_package ─┬─ (verify_gpu_files) ─ load_engine ─ prewarm_device ─ warm_buckets ─ preallocate ─┘
    engine:                                                                └─ import_engine ──┘

The main thread's work is importing Python modules, which holds the GIL. The engine
threads' is hashing, ONNX Runtime's C calls and torch's kernels, which release it; so the
two overlap instead of queueing (:class:`EngineChain`). With the TorchScript engine
``import_engine`` (``import torch``, seconds of GIL) runs on the main thread, first.
``verify_package`` hashes the files the engine maps before any parser reads them; the
tokenizer file is hashed the same way before it is opened.

Each stage's start and end (ms since exec) go into the timeline, which is logged as one
JSON line, written to a file and returned by ``stats``. A stage that fails exits non-zero
with an error naming the stage and the setting to change; systemd restarts the unit.
The device never builds a package: ``edge serve`` on a build host does that before it
execs this module (``edge/default_package.py``).
"""

from __future__ import annotations

import time

# When the interpreter reached our code: the end of the "interpreter" stage.
_MODULE_BOOTTIME_S = time.clock_gettime(time.CLOCK_BOOTTIME)

import importlib
import json
import os
import signal
import sys
import threading
from pathlib import Path

from edge.errors import BootError
from edge.notify import notify
from edge.settings import parse_serve_args
from edge.stages import Handoff, Stages, Task, stage_error
from edge.timeline import Timeline

__all__ = ["main", "boot", "serve"]

_VERIFY_SETTING = "--package DIR (rebuild or re-copy it) or --verify size"


# ------------------------------------------------------------------ stages of the main thread


def import_manifest():
    """The manifest reader (stdlib only: json, hashlib, mmap)."""
    return importlib.import_module("edge.preload.manifest")


def select_engine(pkg, engine: str) -> list[str]:
    """Before seconds of work: the package has files for this engine (or the boot stops here)."""
    return pkg.engine_files(engine)


def verify_package(pkg, names: list[str]) -> None:
    """sha256 of ``names`` against the manifest, before any parser maps them."""
    pkg.verify_files(names)


def verify_gpu_files(pkg, names: list[str]) -> None:
    """sha256 of the files only the GPU path reads (ORT's model.onnx), once CUDA is chosen."""
    pkg.verify_files(names)


def verify_tokenizer(pkg) -> None:
    pkg.verify_files([pkg.manifest.tokenizer])


def import_tokenizer():
    """The tokenizer reader (numpy, flatbuffers); returns its ``load_tokenizer``."""
    return importlib.import_module("edge.preload.tokenizer").load_tokenizer


def prepare_tokenizer(tokenizer) -> None:
    """What the first encode would build (``Tokenizer.prepare``), while the engine warms up."""
    tokenizer.prepare()


def import_server():
    """zmq, msgpack, logging, the protocol and the serving core, while the engine warms up."""
    return importlib.import_module("edge.ipc.server")


# ------------------------------------------------------------------ the engine's chain


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

    def __init__(self, stages: Stages, args, pkg, tokenizer: Handoff) -> None:
        self._stages, self._args, self._pkg, self._tokenizer = stages, args, pkg, tokenizer
        self.engine = self.buffers = self.shapes = None
        self.library = Handoff() if args.engine in self.MAIN_THREAD_IMPORT else None
        self._task = Task("engine", self._chain)

    def _chain(self) -> None:
        run, args, pkg = self._stages.run, self._args, self._pkg
        from edge.device import cuda_available, device_kind, resolve_device
        from edge.engines import import_engine, load_engine

        # Hash the engine's files before any parser sees them: a corrupt file must be refused
        # by name, not crash a native library. Which files depends on the device, known only
        # once the library is loaded: "auto" starts with the CPU's and adds the GPU's if needed.
        verified = set(pkg.engine_files(args.engine, device_kind(args.device)))
        verify = None
        if args.verify == "full":
            verify = Task("verify", lambda: run(verify_package, pkg, sorted(verified), setting=_VERIFY_SETTING,
                                                overlapped=True))
        try:
            if self.library is not None:
                backend = self.library.get()
            else:
                backend = run(import_engine, args.engine, setting="--engine", engine=args.engine, overlapped=True)
        finally:
            if verify is not None:
                verify.result()  # a bad file is the error to report, even if the library failed too
        device = resolve_device(args.device, cuda_available(args.engine, backend))
        extra = sorted(set(pkg.engine_files(args.engine, device_kind(device))) - verified)
        if extra and args.verify == "full":
            run(verify_gpu_files, pkg, extra, setting=_VERIFY_SETTING, overlapped=True)
        engine = run(load_engine, pkg, args.engine, device, setting="--engine / --device", overlapped=True)
        self.engine = engine
        from edge import warmup
        from edge.serving.shapes import BatchShapes

        manifest = pkg.manifest
        shapes = BatchShapes(manifest.serving, max_seq_length=manifest.max_seq_length,
                             kind=device_kind(engine.device))
        run(warmup.prewarm_device, engine, args.cuda_reserve_mb, setting="--device / --cuda-reserve-mb",
            overlapped=True)
        sample = manifest.serving.warm_sample_ids
        if sample is None:  # a package from before the builder stored them
            sample = self._tokenizer.get().encode(warmup.WARM_TEXT, max_length=shapes.buckets[-1]).ids
        # ONNX Runtime warms on its own native inputs (no numpy, which the main thread may
        # still be importing); the buffers come after. Other engines warm through them
        # (pinned host memory on CUDA). Padding is the engine loop's, per batch.
        native = hasattr(engine, "warm_run")
        allocate = lambda: run(warmup.preallocate, shapes, engine, setting="serving.max_batch_size in the package",  # noqa: E731
                               overlapped=True)
        buffers = None if native else allocate()
        run(warmup.warm_buckets, engine, shapes, sample, buffers, setting="serving.warm in the package",
            shapes=len(shapes.warm_shapes()), repeats=shapes.warm_repeats, overlapped=True)
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


# ------------------------------------------------------------------ boot


def lineage_of(manifest, engine):
    """What every reply names as its origin, built once: package, engine, code, bundle."""
    from edge import __version__
    from edge.ipc.protocol import Lineage
    from edge.settings import bundle_sha256

    return Lineage(model=manifest.name, model_sha256=manifest.model_sha256,
                   tokenizer_sha256=manifest.tokenizer_sha256, package_sha256=manifest.package_sha256,
                   bundle_sha256=bundle_sha256(), engine=engine.name, device=engine.device, edge_version=__version__)


def boot(args, timeline: Timeline):
    """Run every stage up to a bound, started server; returns (server, info)."""
    stages = Stages(timeline)
    timeline.add("interpreter", 0.0, timeline.ms_at(_MODULE_BOOTTIME_S))
    manifest_mod = stages.run(import_manifest, setting="reinstall edge")
    if args.package:
        package_dir = Path(args.package)
    else:  # a device ships its package; a build host's `edge serve` builds this one first
        from edge.default_package import default_package_dir

        package_dir = default_package_dir()
    pkg = stages.run(manifest_mod.open_package, package_dir, "size",
                     setting="--package DIR (on a build host, `edge serve` without it builds the default package)")
    stages.run(select_engine, pkg, args.engine, setting="--engine (one the package was built for)")
    manifest = pkg.manifest
    tokenizer_handoff = Handoff()
    chain = EngineChain(stages, args, pkg, tokenizer_handoff)
    try:
        if chain.library is not None:
            from edge.engines import import_engine

            chain.library.put(stages.run(import_engine, args.engine, setting="--engine", engine=args.engine))
        load_tokenizer = stages.run(import_tokenizer, setting="reinstall edge (numpy, flatbuffers)")
        if args.verify == "full":
            stages.run(verify_tokenizer, pkg, setting=_VERIFY_SETTING)
        tokenizer = stages.run(load_tokenizer, pkg.path(manifest.tokenizer), setting="--package DIR (its tokenizer file)")
        tokenizer_handoff.put(tokenizer)
        # zmq, msgpack, logging and the protocol load while the engine thread warms up.
        server_mod = stages.run(import_server, setting="reinstall edge (pyzmq, msgpack)")
        stages.run(prepare_tokenizer, tokenizer, setting="--package DIR (its tokenizer file)")
    except BaseException:
        tokenizer_handoff.cancel()
        if chain.library is not None:
            chain.library.cancel()
        chain.settle()
        raise
    from edge.log import configure

    configure(args.log_level)
    engine, shapes, buffers = chain.result()
    from edge.ipc.endpoint import default_address
    from edge.serving.core import ServingCore

    lineage = lineage_of(manifest, engine)
    core = ServingCore(engine, tokenizer, shapes=shapes, buffers=buffers)
    bind = args.bind or default_address()
    from edge.ipc.curve import server_curve  # --keys: CURVE on tcp:// (read in the bind stage)

    server = server_mod.IpcServer(bind, core, lineage, timeline=timeline.as_dict, drain_timeout_s=args.drain_timeout,
                                  curve=server_curve(args.keys, bind))
    stages.run(server.bind, setting="--bind ADDR", address=bind)
    stages.run(server.start, setting="--bind ADDR")
    timeline.mark_ready()
    return server, {"bind": bind, "package": str(package_dir), "lineage": lineage.as_dict()}


# ------------------------------------------------------------------ the process


def _timeline_path(args, bind: str) -> Path:
    if args.timeline:
        return Path(args.timeline)
    if bind.startswith("ipc://"):
        return Path(bind[len("ipc://"):]).with_name("timeline.json")
    return Path("/tmp/edge-timeline.json")


def _write_timeline(path: Path, record: dict) -> None:
    """Write ``record`` to ``path`` atomically, following no link a local user may have planted:
    the data goes to a new file (O_EXCL: never an existing name or symlink), which a rename puts
    in place (a rename replaces a link at ``path``, it does not write through it)."""
    import tempfile

    from edge.log import log

    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(record, indent=1))
        os.chmod(tmp, 0o640)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        log("timeline.write_failed", level="warning", path=str(path), error=str(exc))


def _quiet_numpy_blas(engine: str) -> None:
    """Keep numpy's OpenBLAS from starting a thread pool it will never use.

    The serving path uses numpy only to pad and split arrays; the matrix work is the
    engine's, on its own threads. Spawning one BLAS thread per core costs 100-200 ms of
    import on a loaded 2-core machine (measured). Only for ONNX Runtime: torch's aarch64
    CPU build uses OpenBLAS for its own work. An explicit setting in the environment wins.
    """
    if engine == "onnxruntime":
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _drain_wait_s(args) -> float:
    """How long the main thread waits for the drain. The I/O thread owns the drain's deadline
    (``--drain-timeout`` from when it saw the request) and answers what is left with
    SHUTTING_DOWN when it passes, then stops the engine loop (2 s at most); the main thread
    must outwait all of that, or the process exits with admitted requests unanswered."""
    return args.drain_timeout + 5.0


def _raise_open_files_limit() -> tuple[int, int]:
    """Soft RLIMIT_NOFILE up to the hard limit; returns (before, after).

    Every client connection is a file descriptor, and libzmq's ipc listener aborts the whole
    process when accept() fails with EMFILE (measured: 4,179 connections at a soft limit of
    4,096 ended the server with "Too many open files (src/ipc_listener.cpp:297)"). systemd's
    default soft limit is 1,024 whatever the hard limit; the hard limit is the real bound.
    The server caps the connections it holds below the limit (``edge/ipc/connections.py``).
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return soft, target
        except (ValueError, OSError):
            pass
    return soft, soft


def serve(args) -> int:
    _quiet_numpy_blas(args.engine)
    _, open_files = _raise_open_files_limit()
    if open_files < 4096:  # the cap then cannot leave libzmq all the room it may take (connection_cap)
        from edge.log import log

        log("boot.open_files_low", level="warning", limit=open_files,
            advice="raise the hard RLIMIT_NOFILE (LimitNOFILE=, the bundle's rlimits) to 4096 or more")
    timeline = Timeline()
    stop = threading.Event()
    # Installed before boot so a signal during boot still ends us cleanly. SIGHUP (a closed
    # terminal, a careless `kill -HUP`) drains like the others instead of killing us mid-request.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server, info = boot(args, timeline)
    except BootError as exc:
        from edge.log import log

        log("boot.failed", level="error", stage=exc.stage, code=int(exc.code), name=exc.code.name, error=str(exc),
            setting=exc.setting, timeline=timeline.as_dict())
        notify(f"STATUS=boot failed in {exc.stage}: {exc.message}"[:400])
        print(f"edge serve: {exc}", file=sys.stderr)
        return 3
    from edge.log import log

    record = {**timeline.as_dict(), **info}
    if stop.is_set():  # SIGTERM while booting: stop without announcing a readiness nobody will use
        log("shutdown.before_ready", **record)
        server.request_drain()
        return 0 if server.wait(_drain_wait_s(args)) else 1
    log("boot.ready", **record)
    _write_timeline(_timeline_path(args, info["bind"]), record)
    lineage = info["lineage"]
    status = f"serving {lineage['model']} on {info['bind']} ({lineage['engine']}/{lineage['device']})"
    notify("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")
    if sys.stderr.isatty():  # a person at a terminal: one plain line beside the JSON log
        print(f"edge: ready in {timeline.ready_ms:.0f} ms, {status}", file=sys.stderr, flush=True)
    while not stop.wait(1.0):
        pass
    log("shutdown.draining", drain_timeout_s=args.drain_timeout)
    notify("STOPPING=1", "STATUS=draining")
    server.request_drain()
    drained = server.wait(_drain_wait_s(args))
    log("shutdown.done", drained=drained)
    return 0 if drained else 1


def main(argv: list[str] | None = None) -> int:
    return serve(parse_serve_args(argv))


if __name__ == "__main__":
    sys.exit(main())
