"""The Python heap during a boot: no collections until READY, and at the snapshot point only
what must be restored.

CPython's cyclic collector runs a full pass whenever the objects that survived earlier passes
have grown by a quarter. A boot does little else than grow them: ``import torch`` leaves about
170,000 long-lived objects, and each full pass walks all of them again (95-117 ms for one
pass over them on the 2-core build machine). So the boot holds the collector
(:func:`hold_collections`, the first thing ``edge.boot`` does) and, at READY,
:func:`release_collections` moves everything the boot made into the permanent generation
(``gc.freeze``: never walked again) before the collector runs again, for what serving
allocates. The boot's own cyclic garbage (a few thousand objects) is never freed: a bounded,
one-time cost.

At the snapshot point (:func:`settle_for_snapshot`) the garbage is collected, the survivors
are frozen, and glibc's allocator gives back its free pages (``malloc_trim``: the warm-up's
activations, freed but cached in its arenas), so that the checkpoint holds only live memory,
and a restored runtime pays no full collection after the restore (which it did, 80-100 ms, at
whichever import came next). Its record (bytes of anonymous memory before and after, objects
freed) goes into the snapshot point's stage.
"""

from __future__ import annotations

import gc

__all__ = ["hold_collections", "release_collections", "settle_for_snapshot", "process_memory"]


_held = False  # set by hold_collections: a boot in another program's process (tests) leaves its collector alone


def hold_collections() -> None:
    """No cyclic collection until :func:`release_collections` (the runtime's own process: ``edge.boot``'s main)."""
    global _held
    _held = True
    gc.disable()


def release_collections() -> None:
    """At READY: what the boot made is frozen (never scanned again), then collections resume."""
    global _held
    if _held:
        _held = False
        gc.freeze()
        gc.enable()


def process_memory() -> dict:
    """VmRSS, RssAnon and RssFile of this process (bytes; those /proc does not give are left out).
    A checkpoint's memory images hold about the anonymous part: file-backed pages are read again
    from the bundle on restore."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in ("VmRSS", "RssAnon", "RssFile"):
                    out[key] = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return out


def _malloc_trim() -> bool | None:
    """glibc's ``malloc_trim(0)``: free pages of every arena back to the kernel. None where the
    C library has none (musl)."""
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))


def settle_for_snapshot() -> dict:
    """Collect, freeze and trim before a checkpoint; what it did, for the timeline."""
    before = process_memory().get("RssAnon")
    freed = gc.collect()
    gc.freeze()
    trimmed = _malloc_trim()
    after = process_memory().get("RssAnon")
    return {"objects_freed": freed, "objects_frozen": gc.get_freeze_count(), "malloc_trim": trimmed,
            "anon_before_bytes": before, "anon_after_bytes": after}
