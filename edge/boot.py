"""``edge serve``: boot the runtime to READY, then serve until SIGTERM.

Stages, on threads that share the machine's cores::

    main:    interpreter ─ import_manifest ─ open_package ─ select_engine ─┬─ import_runtime ─ verify_tokenizer ─ load_tokenizer ─ import_server ─┬─ bind ─ start_server ─ READY
    engine:                                                                ├─ verify_package ─┬─ map_weights ─ prewarm_device ─ warm_buckets ─ preallocate ─┘
    engine:                                                                └─ import_engine ──┘

The main thread's work is importing Python modules, which holds the GIL. The
engine threads' is hashing, ONNX Runtime's C calls and torch's kernels, which
release it; so the two overlap instead of queueing (``_EngineBoot``). With the
TorchScript engine ``import_engine`` (``import torch``, seconds of GIL) runs on
the main thread, first.
``verify_package`` hashes the files the engine maps before any parser reads
them; the tokenizer file is hashed the same way before it is opened.

Each stage's start and end (ms since exec) go into the timeline, which is
logged as one JSON line, written to a file and returned by ``stats``. A stage
that fails exits non-zero with an error naming the stage and the setting to
change; systemd restarts the unit.
"""

from __future__ import annotations

import time

# When the interpreter reached our code: the end of the "interpreter" stage.
_MODULE_BOOTTIME_S = time.clock_gettime(time.CLOCK_BOOTTIME)

import argparse
import importlib
import json
import os
import signal
import sys
import threading
from pathlib import Path

from edge.errors import BootError, EdgeError, ErrorCode
from edge.log import log
from edge.notify import notify
from edge.timeline import Timeline

__all__ = ["main", "boot", "default_package_dir", "ensure_default_package"]

ENGINES = ("onnxruntime", "torchscript")
DEFAULT_ENGINE = "onnxruntime"
DEFAULT_PACKAGE_NAME = "all-MiniLM-L6-v2"
DEFAULT_DRAIN_TIMEOUT_S = 10.0  # SIGTERM to exit; systemd's TimeoutStopSec must exceed it


def default_package_dir() -> Path:
    """Where the default model package lives (built there on first use)."""
    from edge import __version__

    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "edge" / "packages" / f"{DEFAULT_PACKAGE_NAME}-edge{__version__}"


def ensure_default_package(path: Path) -> Path:
    """Build the default package with the build-host tool if it is not there.

    The device never builds (its bundle ships the package); this is for a
    developer machine where ``edge serve`` must work right after install. The
    builder writes beside ``path`` and renames into place, so an interrupted
    build never leaves a half package behind.
    """
    if (path / "manifest.json").exists():
        return path
    import subprocess  # only here: a device never builds

    log("package.build", out=str(path), reason="default package not built yet")
    cmd = [sys.executable, "-m", "image.package", "build", "--out", str(path)]
    result = subprocess.run(cmd, stdout=sys.stderr)
    if result.returncode != 0:
        raise BootError(
            f"building the default package failed (exit {result.returncode}): {' '.join(cmd)}",
            stage="build_package",
            setting="--package DIR (a package built with `edge-package build --out DIR`)",
        )
    return path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(prog="edge serve", description="Boot the runtime and serve ZeroMQ requests.")
    p.add_argument("--package", default=env.get("EDGE_PACKAGE"), help="model package directory (default: the MiniLM package, built on first use; env EDGE_PACKAGE)")
    p.add_argument("--engine", choices=ENGINES, default=env.get("EDGE_ENGINE", DEFAULT_ENGINE), help="inference engine (env EDGE_ENGINE)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default=env.get("EDGE_DEVICE", "auto"), help="where the engine runs; auto picks CUDA when present (env EDGE_DEVICE)")
    p.add_argument("--bind", default=env.get("EDGE_BIND"), help="ZeroMQ address (default ipc:// under $XDG_RUNTIME_DIR or /run/edge; env EDGE_BIND)")
    p.add_argument("--timeline", default=env.get("EDGE_TIMELINE"), help="file for the boot timeline JSON (default: beside the ipc socket, else /tmp)")
    p.add_argument("--verify", choices=("full", "size"), default=env.get("EDGE_VERIFY", "full"), help="package check at boot: sha256 of the files the engine maps (overlapped with the engine import) or sizes only")
    p.add_argument("--drain-timeout", type=float, default=float(env.get("EDGE_DRAIN_TIMEOUT_S", DEFAULT_DRAIN_TIMEOUT_S)), help="seconds to finish in-flight requests after SIGTERM")
    p.add_argument("--cuda-reserve-mb", type=int, default=int(env.get("EDGE_CUDA_RESERVE_MB", 512)), help="device memory reserved up front on CUDA")
    return p.parse_args(argv)


class _Stages:
    """Runs each stage inside the timeline and turns failures into BootError."""

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline

    def run(self, name: str, setting: str, fn, *args, **info):
        try:
            with self.timeline.stage(name, **info):
                return fn(*args)
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise _stage_error(name, exc, setting) from exc


def _stage_error(stage: str, exc: BaseException, setting: str) -> BootError:
    # The boot stage's name wins over a library's own label: the timeline, the
    # log and systemd's status must all name the same stage.
    if isinstance(exc, BootError):
        exc.stage = stage
        exc.setting = setting if not exc.setting or exc.setting in setting else f"{setting}; {exc.setting}"
        return exc
    code = exc.code if isinstance(exc, EdgeError) else ErrorCode.BOOT_STAGE_FAILED
    return BootError(f"{type(exc).__name__}: {exc}", code, stage=stage, setting=setting)


class _Task(threading.Thread):
    """``fn()`` on its own thread; ``result()`` joins and re-raises its error."""

    def __init__(self, name: str, fn) -> None:
        super().__init__(name=f"boot-{name}", daemon=True)
        self._fn = fn
        self.value = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.value = self._fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the joining thread
            self.error = exc

    def result(self):
        self.join()
        if self.error is not None:
            raise self.error
        return self.value


class _Handoff:
    """One value passed from one boot thread to another, or word that it never will be."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._value = None

    def put(self, value) -> None:
        self._value = value
        self._done.set()

    def cancel(self) -> None:
        self._done.set()

    def get(self):
        self._done.wait()
        if self._value is None:
            raise _Cancelled()
        return self._value


class _Cancelled(Exception):
    """The main thread failed first; its error is the one reported."""


def _device_kind(engine: str, device: str, backend) -> str:
    """"cpu" or "cuda": where ``engine`` will run, given the library ``import_engine`` returned."""
    if device != "auto":
        return "cpu" if device == "cpu" else "cuda"
    if engine == "onnxruntime":
        return "cuda" if "CUDAExecutionProvider" in backend.available_providers() else "cpu"
    return "cuda" if backend.cuda.is_available() else "cpu"


_VERIFY_SETTING = "--package DIR (rebuild or re-copy it) or --verify size"


class _EngineBoot:
    """The engine's chain of stages, on threads beside the main thread's imports::

        ┬─ verify_package ─┬─ map_weights ─ prewarm_device ─ warm_buckets ─ preallocate
        └─ import_engine ──┘

    Everything heavy here runs without the GIL: hashlib over a mapping, ONNX
    Runtime's C calls through ctypes (library set-up, session creation, the
    warm-up batches), torch's kernels. The main thread's imports (numpy, the
    tokenizer, zmq) hold the GIL, so the chains share the cores instead of
    queueing on one. Loading the library parses no package file, so it runs
    beside the hashing; the session is created only once the hashes match.

    ``import torch`` is the exception: it holds the GIL for seconds, so the main
    thread runs it first and hands the library over (``MAIN_THREAD_IMPORT``); the
    hashing still runs beside it.

    The warm-up waits for neither numpy nor the tokenizer, both still loading on
    the main thread: ONNX Runtime warms on its own native inputs, and the input
    comes tokenized in the package (``serving.warm_sample_ids``). For an older
    package without it, the main thread hands the tokenizer over.
    """

    # Engines whose library import holds the GIL for seconds (``import torch``): the main
    # thread imports it, first, and hands it over; interleaved with the main thread's other
    # imports it ran 10-25 % slower here. The hashing still runs beside it.
    MAIN_THREAD_IMPORT = frozenset({"torchscript"})

    def __init__(self, stages: _Stages, args: argparse.Namespace, pkg, tokenizer: _Handoff) -> None:
        self._stages, self._args, self._pkg, self._tokenizer = stages, args, pkg, tokenizer
        self.engine = self.buffers = None
        self.library = _Handoff() if args.engine in self.MAIN_THREAD_IMPORT else None
        self._task = _Task("engine", self._chain)

    def _chain(self) -> None:
        run, args, pkg = self._stages.run, self._args, self._pkg
        # Hash the engine's files before any parser sees them: a corrupt file must
        # be refused by name, not crash a native library. The device kind is a
        # guess until the library is loaded: "auto" starts with the CPU files and
        # adds the GPU ones if needed.
        guess = "cuda" if args.device.startswith("cuda") else "cpu"
        verified = set(pkg.engine_files(args.engine, guess))
        verify = None
        if args.verify == "full":
            verify = _Task("verify", lambda: run("verify_package", _VERIFY_SETTING, pkg.verify_files,
                                                 sorted(verified), overlapped=True))
        try:
            from edge.engines import import_engine, load_engine

            if self.library is not None:
                backend = self.library.get()
            else:
                backend = run("import_engine", "--engine", import_engine, args.engine, engine=args.engine,
                              overlapped=True)
        finally:
            if verify is not None:
                verify.result()  # a bad file is the error to report, even if the library failed too
        extra = sorted(set(pkg.engine_files(args.engine, _device_kind(args.engine, args.device, backend))) - verified)
        if extra and args.verify == "full":
            run("verify_package_gpu", _VERIFY_SETTING, pkg.verify_files, extra, overlapped=True)
        engine = run("map_weights", "--engine / --device", load_engine, pkg, args.engine, args.device, overlapped=True)
        self.engine = engine
        from edge import warmup

        serving = pkg.manifest.serving_dict()
        run("prewarm_device", "--device / --cuda-reserve-mb", warmup.prewarm_device, engine, args.cuda_reserve_mb,
            overlapped=True)
        plan = warmup.warm_plan(serving, engine)
        sample = serving.get("warm_sample_ids")
        if sample is None:  # a package from before the builder stored them
            sample = self._tokenizer.get().encode(warmup.WARM_TEXT, max_length=max(serving["buckets"])).ids

        def preallocate():
            # Padding is the engine loop's, per batch; the buffers start zeroed.
            return run("preallocate", "serving.max_batch_size in the package", warmup.preallocate, serving, engine,
                       overlapped=True)

        # ONNX Runtime warms on its own native inputs (no numpy, which the main thread may
        # still be importing); the buffers come after. Other engines warm through them.
        native = hasattr(engine, "warm_run")
        buffers = None if native else preallocate()
        run("warm_buckets", "serving.warm in the package", warmup.warm_buckets, engine, plan, sample, buffers,
            shapes=len(plan.shapes), repeats=plan.repeats, overlapped=True)
        self.buffers = preallocate() if native else buffers

    def result(self):
        """(engine, buffers) once every stage is done; re-raises the chain's failure as a BootError."""
        try:
            self._task.result()
        except BaseException as exc:
            if isinstance(exc, BootError) and exc.stage:
                raise
            err = _stage_error("engine", exc, "--engine / --package DIR")  # outside any stage
            if err is exc:
                raise
            raise err from exc
        return self.engine, self.buffers

    def settle(self, timeout_s: float = 30.0) -> None:
        """After a main-thread failure: let the chain leave its native call before we exit.

        It stops at the tokenizer handoff (cancelled by the caller) or at its end;
        exiting while it is inside ONNX Runtime or torch could crash the
        interpreter's teardown and hide the error we report.
        """
        self._task.join(timeout_s)
        if self.engine is not None and not self._task.is_alive():
            self.engine.close()


def boot(args: argparse.Namespace, timeline: Timeline):
    """Run every stage up to a bound, started server; returns (server, info)."""
    stages = _Stages(timeline)
    timeline.add("interpreter", 0.0, timeline.ms_at(_MODULE_BOOTTIME_S))
    with timeline.stage("import_manifest"):
        from edge.preload.manifest import open_package  # stdlib only: json, hashlib, mmap
    if args.package:
        package_dir = Path(args.package)
    else:
        package_dir = stages.run("build_package", "--package DIR", ensure_default_package, default_package_dir())
    pkg = stages.run("open_package", "--package DIR", open_package, package_dir, "size")
    # Before seconds of work: does the package have files for this engine at all?
    stages.run("select_engine", "--engine (one the package was built for)", pkg.engine_files, args.engine)
    manifest = pkg.manifest
    tokenizer_handoff = _Handoff()
    engine_boot = _EngineBoot(stages, args, pkg, tokenizer_handoff)
    try:
        if engine_boot.library is not None:
            from edge.engines import import_engine

            engine_boot.library.put(stages.run("import_engine", "--engine", import_engine, args.engine,
                                               engine=args.engine))
        with timeline.stage("import_runtime"):
            from edge.preload.tokenizer import Tokenizer
        tokenizer_path = pkg.path(manifest.tokenizer)
        if args.verify == "full":
            stages.run("verify_tokenizer", _VERIFY_SETTING, pkg.verify_files, [manifest.tokenizer])
        tokenizer = stages.run("load_tokenizer", "--package DIR (its tokenizer file)", Tokenizer.open, tokenizer_path)
        tokenizer_handoff.put(tokenizer)
        # zmq, msgpack and the protocol load while the engine thread warms up.
        server_mod = stages.run("import_server", "reinstall edge (pyzmq, msgpack)", importlib.import_module,
                                "edge.ipc.server")
    except BaseException:
        tokenizer_handoff.cancel()
        if engine_boot.library is not None:
            engine_boot.library.cancel()
        engine_boot.settle()
        raise
    engine, buffers = engine_boot.result()
    serving = manifest.serving_dict()
    lineage = {
        "model": manifest.name,
        "model_sha256": manifest.model_sha256,
        "tokenizer_sha256": manifest.tokenizer_sha256,
        "package_sha256": manifest.package_sha256,
        "engine": engine.name,
        "device": engine.device,
    }
    bind = args.bind or server_mod.default_bind_address()
    server = server_mod.IpcServer(
        bind=bind, engine=engine, tokenizer=tokenizer, serving=serving,
        max_seq_length=manifest.max_seq_length, lineage=lineage, input_buffers=buffers,
        timeline=timeline.as_dict, drain_timeout_s=args.drain_timeout,
    )
    stages.run("bind", "--bind ADDR", server.bind, address=bind)
    stages.run("start_server", "--bind ADDR", server.start)
    timeline.mark_ready()
    return server, {"bind": bind, "package": str(package_dir), "lineage": lineage}


def _timeline_path(args: argparse.Namespace, bind: str) -> Path:
    if args.timeline:
        return Path(args.timeline)
    if bind.startswith("ipc://"):
        return Path(bind[len("ipc://"):]).with_name("timeline.json")
    return Path("/tmp/edge-timeline.json")


def _write_timeline(path: Path, record: dict) -> None:
    try:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, path)
    except OSError as exc:
        log("timeline.write_failed", path=str(path), error=str(exc))


def _quiet_numpy_blas(engine: str) -> None:
    """Keep numpy's OpenBLAS from starting a thread pool it will never use.

    The serving path uses numpy only to pad and split arrays; the matrix work
    is the engine's, on its own threads. Spawning one BLAS thread per core
    costs 100-200 ms of import on a loaded 2-core machine (measured). Only for
    ONNX Runtime: torch's aarch64 CPU build uses OpenBLAS for its own work. An
    explicit setting in the environment wins.
    """
    if engine == "onnxruntime":
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def serve(args: argparse.Namespace) -> int:
    _quiet_numpy_blas(args.engine)
    timeline = Timeline()
    stop = threading.Event()
    # Installed before boot so a SIGTERM during boot still ends us cleanly.
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        server, info = boot(args, timeline)
    except BootError as exc:
        log("boot.failed", stage=exc.stage, code=int(exc.code), name=exc.code.name, error=str(exc), setting=exc.setting, timeline=timeline.as_dict())
        notify(f"STATUS=boot failed in {exc.stage}: {exc.message}"[:400])
        print(f"edge: {exc}", file=sys.stderr)
        return 1
    record = {**timeline.as_dict(), **info}
    log("boot.ready", **record)
    _write_timeline(_timeline_path(args, info["bind"]), record)
    notify("READY=1", f"STATUS=serving {info['lineage']['model']} on {info['bind']} ({info['lineage']['engine']}/{info['lineage']['device']})", f"MAINPID={os.getpid()}")
    while not stop.wait(1.0):
        pass
    log("shutdown.draining", drain_timeout_s=args.drain_timeout)
    notify("STOPPING=1", "STATUS=draining")
    server.request_drain()
    drained = server.wait(args.drain_timeout)
    log("shutdown.done", drained=drained)
    return 0 if drained else 1


def main(argv: list[str] | None = None) -> int:
    return serve(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
