"""The snapshot point: where a booting runtime waits to be checkpointed, and what it does once
restored (``edge serve --snapshot-point``; docs/snapshot.md).

The point comes after the imports, the mapped weights, the loaded tokenizer and the CPU
warm-up, and before any CUDA call and before the socket is bound: what a checkpoint holds
must not depend on the device's state or on a client. There the runtime

1. writes ``snapshot-point.json`` beside its timeline (the socket directory by default): its
   pid, the stages so far, and the identity (device, inode, size, mtime) of every file it maps;
2. waits for SIGUSR2 (or a stop signal), with nothing else running: ``runc checkpoint`` takes
   the container now, and a restore starts from this wait.

SIGUSR2 ends the wait, in the original process (a resume without a checkpoint: the boot goes
on) or in a restored one. The restorer writes ``snapshot-resume.json`` first, with when the
restore began on CLOCK_REALTIME: CRIU restores the process into a time namespace that keeps
its monotonic and boot-time clocks running on from the checkpoint, so only the wall clock is
shared with the restorer. The runtime then runs :func:`after_restore`: it reseeds the
random generators (two restores of one snapshot must not repeat each other), checks that
every mapped file is still the one the snapshot mapped (a changed file is refused with
SNAPSHOT_STALE, and the supervisor boots fresh), and the boot goes on with the device, the
socket and READY.
"""

from __future__ import annotations

import json
import os
import select
import signal
import threading
import time
from pathlib import Path

from edge.errors import BootError, ErrorCode
from edge.runtime.heap import process_memory
from edge.runtime.stages import Stages
from edge.runtime.timeline import Timeline

__all__ = ["MARKER", "RESUME", "RESUME_SIGNAL", "beside_name", "file_identity", "pause_for_snapshot", "wait_at_snapshot_point",
           "after_restore"]

MARKER = "snapshot-point.json"  # written by the runtime when it waits
RESUME = "snapshot-resume.json"  # written by the restorer before it sends RESUME_SIGNAL
RESUME_SIGNAL = signal.SIGUSR2
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def file_identity(path: str) -> dict:
    """What makes a mapped file the same file, cheaply: no read of its bytes."""
    st = os.stat(path)
    return {"path": path, "dev": st.st_dev, "ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _write_json(path: Path, record: dict) -> None:
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    os.chmod(tmp, 0o640)
    os.replace(tmp, path)


def wait_at_snapshot_point(directory: Path, files: list[dict], timeline: dict, stop: threading.Event) -> dict | None:
    """Write the marker, then block until RESUME_SIGNAL; the resume record (``{}`` when the
    restorer wrote none), or None when a stop signal came first. Main thread only."""
    resumed = threading.Event()
    r, w = os.pipe()
    os.set_blocking(w, False)
    old_wakeup = signal.set_wakeup_fd(w)  # the C handler writes here whichever thread gets the signal
    old_handler = signal.signal(RESUME_SIGNAL, lambda *_: resumed.set())
    resume_path = directory / RESUME
    try:
        resume_path.unlink(missing_ok=True)  # a stale one would tell a plain resume it was restored
        _write_json(directory / MARKER, {"pid": os.getpid(), "boottime_ns": time.clock_gettime_ns(time.CLOCK_BOOTTIME),
                                         "memory": process_memory(), "files": files, "timeline": timeline})
        while not resumed.is_set() and not stop.is_set():
            select.select([r], [], [])
            os.read(r, 512)  # the Python-level handlers run once this returns
    finally:
        signal.set_wakeup_fd(old_wakeup)
        signal.signal(RESUME_SIGNAL, old_handler)
        os.close(r)
        os.close(w)
    if not resumed.is_set():
        return None
    try:
        record = json.loads(resume_path.read_text())
        return record if isinstance(record, dict) else {}
    except (OSError, ValueError):
        return {}


def after_restore(files: list[dict]) -> None:
    """Reseed the random generators; raise SNAPSHOT_STALE naming the first mapped file that changed."""
    import sys

    # From os.urandom, so restored copies diverge. Only generators already loaded: a module
    # imported later seeds itself, and the bundle's rootfs holds only what its boot imported.
    for name, reseed in (("random", "seed"), ("numpy.random", "seed"), ("torch", "seed")):
        module = sys.modules.get(name)
        if module is not None:
            getattr(module, reseed)()
    for recorded in files:
        try:
            now = file_identity(recorded["path"])
        except OSError as exc:
            raise BootError(f"{recorded['path']} is gone since the snapshot was taken ({exc.strerror})",
                            ErrorCode.SNAPSHOT_STALE, setting="take a new snapshot (edge-bundle snapshot)") from None
        changed = [k for k in ("dev", "ino", "size", "mtime_ns") if now[k] != recorded[k]]
        if changed:
            raise BootError(f"{recorded['path']} changed since the snapshot was taken ({', '.join(changed)})",
                            ErrorCode.SNAPSHOT_STALE, setting="take a new snapshot (edge-bundle snapshot)")


def beside_name(resume: dict) -> str | None:
    """The socket file name a restored runtime binds first, in its socket's directory, when the
    restorer asked it to start beside a runtime still serving (``beside``: docs/update.md, "Beside
    the old runtime"); it then takes the address over once it is ready. None: bind the address."""
    name = resume.get("beside")
    if not isinstance(name, str):
        return None
    if not name.startswith(".") or "/" in name or "\0" in name or len(name) > 64 or name in (".", ".."):
        raise BootError(f"snapshot-resume.json: beside {name!r} is not a hidden file name",
                        ErrorCode.SNAPSHOT_STALE, setting="edge-supervise writes it; restart the unit")
    return name


def pause_for_snapshot(directory: Path, mapped: list[str], timeline: Timeline,
                       stop: threading.Event) -> tuple[Timeline, dict] | None:
    """The snapshot point of a boot: wait there, then return the timeline the boot goes on
    with, and the resume record: the same timeline after a plain resume; after a restore, a new
    one that starts when the restore did, says ``start: restored`` and keeps the snapshot's own
    boot under ``snapshot``. None when a stop signal came while waiting."""
    files = [file_identity(p) for p in mapped]
    taken_ms = timeline.now_ms()
    resume = wait_at_snapshot_point(directory, files, timeline.as_dict(), stop)
    if resume is None:
        return None
    resumed_s, resumed_wall_ns = time.clock_gettime(time.CLOCK_BOOTTIME), time.clock_gettime_ns(time.CLOCK_REALTIME)
    if not resume.get("restored"):
        timeline.add("snapshot_wait", taken_ms, timeline.ms_at(resumed_s))
        return timeline, resume
    started_ns = resume.get("restore_started_realtime_ns")
    took_s = (resumed_wall_ns - started_ns) / 1e9 if isinstance(started_ns, int) else 0.0
    restored = Timeline(exec_s=resumed_s - (took_s if 0 <= took_s < 600 else 0.0))  # exec: the restore's start
    restored.start = "restored"
    restored.snapshot = {**timeline.as_dict(), "snapshot_point_ms": round(taken_ms, 3)}
    restored.add("restore", 0.0, restored.ms_at(resumed_s))  # runc restore, CRIU: until the wait ended
    Stages(restored).run(restore_hook, files, setting="take a new snapshot (edge-bundle snapshot)")
    return restored, resume


def restore_hook(files: list[dict]) -> None:
    """The restore's own stage: :func:`after_restore`."""
    after_restore(files)
