"""``python -m edge.boot``: boot the runtime to READY, then serve until SIGTERM.

The stages, each named in the timeline after the function it runs (grep the name)::

    main:    interpreter ─ boot_imports ─ parse_serve_args ─┬─ import_manifest ─ open_package ─ select_engine ─ import_tokenizer ─ verify_tokenizer ─ load_tokenizer ─ import_server ─ prepare_tokenizer ─ verify_package ─┬─ bind ─ start ─ READY
    engine:                                                 └─ import_engine ─ load_engine ─ prewarm_device ─ warm_buckets ─ preallocate ──────────────────────────────────────────────────────────────────────────┘

The main thread's work is importing Python modules, which holds the GIL. The engine
thread's is ONNX Runtime's C calls and torch's kernels, which release it; so the two overlap
instead of queueing (:class:`EngineChain`). With the TorchScript engine ``import_engine``
(``import torch``, seconds of GIL) runs on the main thread, first. ``verify_package`` hashes
the files the engine maps (hashlib releases the GIL too) while the engine loads and warms on
them, on whichever thread is free first (the main thread, its imports done, or the engine's,
its warm-up done); the boot binds only once every hash has matched, so no reply comes from a
file that failed (``EngineChain.result``). The tokenizer file is hashed before it is opened.
With a ``--metrics-*`` flag, ``check_metrics_export`` runs first; the exporter itself starts
after READY.

Each stage's start and end (ms since exec) go into the timeline, which is logged as one
JSON line, written to a file and returned by ``stats``. A stage that fails exits non-zero
with an error naming the stage and the setting to change; systemd restarts the unit.
The device never builds a package: ``edge serve`` on a build host does that before it
execs this module (``edge/runtime/default_package.py``).
"""

from __future__ import annotations

import time

# When the interpreter reached our code: the end of the "interpreter" stage.
_MODULE_BOOTTIME_S = time.clock_gettime(time.CLOCK_BOOTTIME)

import importlib
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING

from edge.runtime.heap import hold_collections, release_collections
from edge.runtime.engine_chain import VERIFY_SETTING, EngineChain, verified_by
from edge.errors import BootError
from edge.system.notify import notify
from edge.runtime.serve_args import parse_serve_args
from edge.runtime.stages import Handoff, Stages
from edge.runtime.timeline import Timeline

if TYPE_CHECKING:
    from pathlib import Path

# When edge.boot's own imports were done: the end of the "boot_imports" stage. They are what the
# command line and the engine's thread need; json and pathlib (10-15 ms with re) come with the
# manifest's reader, while the engine's library loads beside it.
_IMPORTED_BOOTTIME_S = time.clock_gettime(time.CLOCK_BOOTTIME)
# A runtime restored beside another waits this long (s) for what that one holds until it has stopped
# (the journal's lock, a --metrics-listen port): its drain (10 s),
# the engine loop's stop (2 s) and LINGER (1 s) end within it; edge-supervise kills it at 15 s.
HANDOVER_WAIT_S = 20.0

__all__ = ["main", "boot", "serve"]



# ------------------------------------------------------------------ stages of the main thread


def import_manifest():
    """The manifest reader (stdlib only: json, hashlib, mmap)."""
    return importlib.import_module("edge.preload.manifest")


def select_engine(pkg, engine: str) -> list[str]:
    """Before seconds of work: the package has files for this engine (or the boot stops here)."""
    return pkg.engine_files(engine)


def verify_tokenizer(pkg) -> dict[str, str]:
    """The tokenizer file against the manifest, before it is opened (as ``verify_package``)."""
    return pkg.verify_files([pkg.manifest.tokenizer])


def import_tokenizer():
    """The tokenizer reader (numpy, flatbuffers); returns its ``load_tokenizer``."""
    return importlib.import_module("edge.preload.tokenizer").load_tokenizer


def prepare_tokenizer(tokenizer) -> None:
    """What the first encode would build (``Tokenizer.prepare``), while the engine warms up."""
    tokenizer.prepare()


def import_server():
    """zmq, msgpack, logging, the protocol and the serving core, while the engine warms up."""
    return importlib.import_module("edge.ipc.server")


# ------------------------------------------------------------------ boot


def lineage_of(manifest, engine):
    """What every reply names as its origin, built once: package, engine, code, bundle."""
    from edge.ipc.protocol import Lineage
    from edge.config.env import bundle_sha256
    from edge.system.version import __version__, code_commit  # reads a few small files, no subprocess (~0.2 ms)

    return Lineage(model=manifest.name, model_sha256=manifest.model_sha256,
                   tokenizer_sha256=manifest.tokenizer_sha256, package_sha256=manifest.package_sha256,
                   bundle_sha256=bundle_sha256(), engine=engine.name, device=engine.device, edge_version=__version__,
                   edge_commit=code_commit())


def _snapshot_point(args, pkg, bind: str, timeline: Timeline, stop) -> tuple[Timeline, dict] | None:
    """Wait at the snapshot point (``--snapshot-point``); the timeline to go on with and the resume
    record, or None when a stop signal came first (``edge/runtime/snapshot.py``)."""
    from edge.runtime.snapshot import pause_for_snapshot

    spec = pkg.manifest.engines[args.engine]
    names = {pkg.manifest.tokenizer, *spec.get("files", ()), *spec.get("gpu_files", ())}
    mapped = [str(pkg.path(n)) for n in sorted(names)] + [str(pkg.root / "manifest.json")]
    from edge.runtime.heap import settle_for_snapshot

    Stages(timeline).run(settle_for_snapshot, setting="--snapshot-point", note=lambda record: record)
    return pause_for_snapshot(_timeline_path(args, bind).parent, mapped, timeline, stop)


def boot(args, timeline: Timeline, stop: threading.Event | None = None):
    """Run every stage up to a bound, started server; returns (server, info). With
    ``--snapshot-point`` it waits at the snapshot point first; (None, info) when a stop signal
    came there."""
    stages = Stages(timeline)
    timeline.add("interpreter", 0.0, timeline.ms_at(_MODULE_BOOTTIME_S))
    # The module-level imports above: no function runs them, the stage is named as edge-coldstart names it.
    timeline.add("boot_imports", timeline.ms_at(_MODULE_BOOTTIME_S), timeline.ms_at(_IMPORTED_BOOTTIME_S))
    if getattr(args, "metrics_textfile", None) or getattr(args, "metrics_listen", None):
        from edge.observability.metrics.publish import check_metrics_export  # stdlib only: prometheus_client comes after READY

        stages.run(check_metrics_export, args, setting="--metrics-textfile DIR, --metrics-listen HOST:PORT")
    tokenizer_handoff = Handoff()
    # The engine's thread starts first: its library needs no package file (edge/runtime/engine_chain.py).
    chain = EngineChain(stages, args, tokenizer_handoff, stop_before_cuda=args.snapshot_point)
    try:
        manifest_mod = stages.run(import_manifest, setting="reinstall edge")
        from pathlib import Path  # imported by the manifest's reader already

        if args.package:
            package_dir = Path(args.package)
        else:  # a device ships its package; a build host's `edge serve` builds this one first
            from edge.runtime.default_package import default_package_dir

            package_dir = default_package_dir()
        # Only this engine's files: a bundle's package holds no other's (image/bundle/package_copy.py).
        pkg = stages.run(manifest_mod.open_package, package_dir, "size", args.engine,
                         setting="--package DIR (on a build host, `edge serve` without it builds the default package)")
        stages.run(select_engine, pkg, args.engine, setting="--engine (one the package was built for)")
        manifest = pkg.manifest
        chain.open(pkg)
        if chain.library is not None:
            from edge.engines import import_engine

            chain.library.put(stages.run(import_engine, args.engine, setting="--engine", engine=args.engine))
        load_tokenizer = stages.run(import_tokenizer, setting="reinstall edge (numpy, flatbuffers)")
        if args.verify == "full":
            stages.run(verify_tokenizer, pkg, setting=VERIFY_SETTING, note=verified_by)
        tokenizer = stages.run(load_tokenizer, pkg.path(manifest.tokenizer), setting="--package DIR (its tokenizer file)")
        tokenizer_handoff.put(tokenizer)
        # zmq, msgpack, logging and the protocol load while the engine thread warms up.
        server_mod = stages.run(import_server, setting="reinstall edge (pyzmq, msgpack)")
        stages.run(prepare_tokenizer, tokenizer, setting="--package DIR (its tokenizer file)")
        chain.verify_here()
    except BaseException:
        tokenizer_handoff.cancel()
        chain.cancel()
        chain.settle()
        raise
    from edge.system.log import configure

    configure(args.log_level)
    engine, shapes, buffers = chain.result()
    from edge.ipc.endpoint import default_address
    from edge.serving.core import ServingCore

    bind = args.bind or default_address()
    beside = None  # restored beside a runtime that still serves: the file name bound first
    if args.snapshot_point:
        resumed = _snapshot_point(args, pkg, bind, timeline, stop or threading.Event())
        if resumed is None:
            return None, {"bind": bind, "package": str(package_dir)}
        timeline, resume = resumed
        stages = Stages(timeline)
        from edge.runtime.snapshot import beside_name

        if "beside" in resume and bind.startswith("ipc://"):  # a handover's restore (edge-supervise asks)
            beside = stages.run(beside_name, resume, setting="restart the unit")
        if chain.pending:  # CUDA: the device stages come after the restore
            engine, shapes, buffers = chain.finish(stages)
    from edge.runtime.fallback import boot_fallback

    fallback = boot_fallback(stages, args, pkg, shapes)  # after a restore: a CUDA fallback touches the device
    lineage = lineage_of(manifest, engine)
    if fallback is not None:
        fallback.lineage = lineage_of(fallback.manifest, fallback.engine)  # what degraded replies name
    core = ServingCore(_with_faults(engine, args), tokenizer, shapes=shapes, buffers=buffers, fallback=fallback,
                       breaker=_breaker(args, fallback is not None), cost=_engine_cost(chain.warm),
                       probe_ids=manifest.serving.warm_sample_ids, warm_later=chain.warm_later)
    from edge.ipc.curve import server_curve  # --keys: CURVE on tcp:// (read in the bind stage)

    own = f"ipc://{os.path.join(os.path.dirname(bind[len('ipc://'):]), beside)}" if beside else bind
    server = server_mod.IpcServer(own, core, lineage, timeline=timeline.as_dict, drain_timeout_s=args.drain_timeout,
                                  curve=server_curve(args.keys, bind))
    from edge.observability.journal.writer import open_journal  # its queue takes replies at once; its thread starts after READY

    server.journal = open_journal(args, lineage.as_dict(), fallback.lineage.as_dict() if fallback else None)
    stages.run(server.bind, setting=lambda: _bind_setting(bind), address=own)  # computed only if it fails
    stages.run(server.start, setting="--bind ADDR")
    if beside:  # the switch: new connections come here from now on; the old runtime drains its own
        stages.run(server.take_over, bind, setting="restart the unit (a stop, then a start)", address=bind)
        if server.journal is not None:  # the old runtime holds the journal's lock until it has drained
            server.journal.lock_wait_s = HANDOVER_WAIT_S
    timeline.mark_ready()
    release_collections()
    return server, {"bind": bind, "package": str(package_dir), "lineage": lineage.as_dict(),
                    **({"beside": beside} if beside else {})}


def _breaker(args, has_fallback: bool):
    from edge.serving.breaker import CircuitBreaker

    return CircuitBreaker(threshold=args.breaker_threshold, cooldown_s=args.breaker_cooldown,
                          probes=args.breaker_probes, has_fallback=has_fallback)


def _engine_cost(warm: dict | None):
    """The primary's cost per shape from its own warm-up (measured before any fault is wrapped
    around it): what tells the breaker an engine's miss from a client's impossible deadline."""
    from typing import cast

    from edge.serving.engine_cost import EngineCost

    fastest = (warm or {}).get("fastest_ms") or {}
    # Keys are "ROWSxTOKENS" (edge/warmup.py): two ints each.
    return EngineCost({cast("tuple[int, int]", tuple(int(x) for x in key.split("x"))): ms
                       for key, ms in fastest.items()})


def _with_faults(engine, args):
    """The primary engine, with the faults --fault-engine-* ask for (tests, technicians): warned of."""
    from edge.serving.faults import with_faults

    delay, rate = args.fault_engine_delay_ms, args.fault_engine_error_rate
    if delay or rate:
        from edge.system.log import log

        log("boot.fault_injection", level="warning", engine_delay_ms=delay, engine_error_rate=rate,
            message="the primary engine is slowed or failed on purpose (--fault-engine-*): a test setting")
    return with_faults(engine, delay, rate)


def _bind_setting(bind: str) -> str:
    """What to change when bind fails: ``--bind ADDR``; under a bundle, whose address is not its
    user's to change, the socket directory, its owner and the fix (edge/system/socket_dir.py)."""
    from edge.config.env import bundle_sha256, bundle_socket_dir

    if not bundle_sha256() or not bind.startswith("ipc://"):
        return "--bind ADDR"
    from edge.system.socket_dir import bind_advice

    return bind_advice(os.path.dirname(bind[len("ipc://"):]), bundle_socket_dir())


# ------------------------------------------------------------------ the process


def _timeline_path(args, bind: str) -> Path:
    from pathlib import Path

    if args.timeline:
        return Path(args.timeline)
    if bind.startswith("ipc://"):
        return Path(bind[len("ipc://"):]).with_name("timeline.json")
    return Path("/tmp/edge-timeline.json")


def _write_timeline(path: Path, record: dict) -> None:
    """Write ``record`` to ``path`` atomically, following no link a local user may have planted:
    the data goes to a new file (O_EXCL: never an existing name or symlink), which a rename puts
    in place (a rename replaces a link at ``path``, it does not write through it)."""
    import json
    import tempfile

    from edge.system.log import log

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


def _stop_journal(server, timeout_s: float = 3.0) -> None:
    """Write the journal's queued entries (the drain's replies included) and close it."""
    if server.journal is not None and not server.journal.stop(timeout_s):
        from edge.system.log import log

        log("journal.stop_timeout", level="warning", queued=server.journal.info()["queued"], timeout_s=timeout_s)


def serve(args, parsed_s: tuple[float, float] | None = None) -> int:
    """Boot, announce READY, serve until a stop signal. ``parsed_s``: when :func:`main` parsed the
    command line (CLOCK_BOOTTIME, s: start and end), for the timeline."""
    _quiet_numpy_blas(args.engine)
    _, open_files = _raise_open_files_limit()
    if open_files < 4096:  # the cap then cannot leave libzmq all the room it may take (connection_cap)
        from edge.system.log import log

        log("boot.open_files_low", level="warning", limit=open_files,
            advice="raise the hard RLIMIT_NOFILE (LimitNOFILE=, the bundle's rlimits) to 4096 or more")
    timeline = Timeline()
    if parsed_s is not None:
        timeline.add(parse_serve_args.__name__, timeline.ms_at(parsed_s[0]), timeline.ms_at(parsed_s[1]))
    stop = threading.Event()
    # Installed before boot so a signal during boot still ends us cleanly. SIGHUP (a closed
    # terminal, a careless `kill -HUP`) drains like the others instead of killing us mid-request.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server, info = boot(args, timeline, stop)
    except BootError as exc:
        from edge.system.log import log

        log("boot.failed", level="error", stage=exc.stage, code=int(exc.code), name=exc.code.name, error=str(exc),
            setting=exc.setting, timeline=timeline.as_dict())
        notify(f"STATUS=boot failed in {exc.stage}: {exc.message}"[:400])
        print(f"edge serve: {exc}", file=sys.stderr)
        return 3
    from edge.system.log import log

    if server is None:  # stopped at the snapshot point
        log("shutdown.at_snapshot_point", **info)
        return 0
    record = {**server.timeline(), **info}
    if stop.is_set():  # SIGTERM while booting: stop without announcing a readiness nobody will use
        log("shutdown.before_ready", **record)
        server.request_drain()
        drained = server.wait(_drain_wait_s(args))
        _stop_journal(server)
        return 0 if drained else 1
    log("boot.ready", **record)
    _write_timeline(_timeline_path(args, info["bind"]), record)
    lineage = info["lineage"]
    status = f"serving {lineage['model']} on {info['bind']} ({lineage['engine']}/{lineage['device']})"
    notify("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")
    if sys.stderr.isatty():  # a person at a terminal: one plain line beside the JSON log
        print(f"edge: ready in {record['exec_to_ready_ms']:.0f} ms ({record['start']}), {status}", file=sys.stderr,
              flush=True)
    telemetry = None
    if getattr(args, "telemetry_interval", 0) > 0:  # after READY: the sampler reads on its own thread
        from edge.observability.telemetry import start_sampler

        telemetry = start_sampler(server, args.telemetry_interval)
    from edge.observability.metrics.publish import start_metrics  # after READY: prometheus_client's import costs ~60-100 ms

    metrics = start_metrics(args, server, listen_wait_s=HANDOVER_WAIT_S if info.get("beside") else 0.0)
    if server.journal is not None:  # after READY: the writer creates its directories and lists segments
        server.journal.start()
    while not stop.wait(1.0):
        pass
    log("shutdown.draining", drain_timeout_s=args.drain_timeout)
    notify("STOPPING=1", "STATUS=draining")
    server.request_drain()
    drained = server.wait(_drain_wait_s(args))
    if telemetry is not None:
        telemetry.stop()
    _stop_journal(server)  # before the last metrics write, which then counts every entry
    if metrics is not None:  # a last write: the file says stopped, with the final counts; not when handed
        metrics.stop(final_write=not server.handed_over)  # over: the file is the new runtime's (it serves on)
    log("shutdown.done", drained=drained)
    return 0 if drained else 1


def main(argv: list[str] | None = None) -> int:
    start = time.clock_gettime(time.CLOCK_BOOTTIME)
    hold_collections()  # until READY: a full pass would walk every object the imports made (edge/runtime/heap.py)
    args = parse_serve_args(argv)  # argparse and the EDGE_* variables: 3-5 ms here
    return serve(args, (start, time.clock_gettime(time.CLOCK_BOOTTIME)))


def exit_without_finalizing(code: int) -> None:
    """End the process without the interpreter's finalization: ~45 ms here (the engines' teardown,
    every module's dict) that the next start waits for, on an update's outage path. Nothing is
    lost: serve() has closed the journal, the metrics file and the timeline, each log line is
    flushed as it is written, and every thread left is a daemon."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or its reader gone
            pass
    os._exit(code)


if __name__ == "__main__":
    exit_without_finalizing(main())
