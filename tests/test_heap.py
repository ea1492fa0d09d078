"""edge/runtime/heap.py: the collector held during a boot, frozen at READY, and the heap settled
before a checkpoint. Each case runs in its own interpreter: they change process-wide state."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> None:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_collections_are_held_until_ready_then_the_boot_is_frozen():
    _run("""
        import gc
        from edge.runtime import heap
        heap.release_collections()  # never held (a boot inside another program): its collector is left alone
        assert gc.isenabled() and gc.get_freeze_count() == 0
        heap.hold_collections()
        assert not gc.isenabled()
        made = [object() for _ in range(1000)]
        heap.release_collections()
        assert gc.isenabled() and gc.get_freeze_count() >= 1000
    """)


def test_the_snapshot_point_collects_cycles_freezes_and_says_what_it_did():
    _run("""
        import ctypes, gc, weakref
        from edge.runtime import heap
        heap.hold_collections()
        class Node: pass
        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        assert gone() is not None  # a cycle: only the collector frees it
        # 32 MiB that malloc keeps once freed (below its top, which a small block holds): what a
        # warm-up's activations leave in glibc's arenas.
        libc = ctypes.CDLL(None)
        libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        blocks = [libc.malloc(1 << 16) for _ in range(512)]
        for p in blocks:
            ctypes.memset(p, 1, 1 << 16)
        guard = libc.malloc(100_000)  # above them: the top of the heap stays
        for p in blocks:
            libc.free(p)
        record = heap.settle_for_snapshot()
        assert gone() is None and record["objects_freed"] >= 2
        assert record["objects_frozen"] == gc.get_freeze_count() > 0
        assert record["malloc_trim"] is True  # glibc: the pages went back
        assert record["anon_before_bytes"] - record["anon_after_bytes"] > 24 << 20, record
    """)
