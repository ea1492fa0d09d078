"""Boot timeline: when each stage started and ended, in ms since exec.

"Exec" is the moment the kernel started this process. We read it from
/proc/self/stat (jiffies since boot, on the CLOCK_BOOTTIME scale), so the
interpreter's own start-up counts too. A launcher that knows the exec time
more precisely (the cold-start benchmark) passes ``EDGE_EXEC_BOOTTIME_NS``:
CLOCK_BOOTTIME in ns just before it called exec.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager

__all__ = ["Timeline", "exec_boottime_s"]


def exec_boottime_s() -> float:
    """This process's exec time on the CLOCK_BOOTTIME scale, in seconds."""
    from edge.config.env import exec_boottime_hint_ns

    hint = exec_boottime_hint_ns()
    if hint is not None:
        return hint / 1e9
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        # Field 22 (starttime); the command name (field 2) may hold spaces, so
        # count from the closing parenthesis.
        fields = stat[stat.rindex(b")") + 2 :].split()
        return int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.clock_gettime(time.CLOCK_BOOTTIME)


class Timeline:
    """Stage start/end times; thread-safe so overlapped stages can record."""

    def __init__(self, exec_s: float | None = None) -> None:
        self._exec_s = exec_boottime_s() if exec_s is None else exec_s
        self._lock = threading.Lock()
        self._stages: list[dict] = []
        self.ready_ms: float | None = None
        self.start = "fresh"  # or "restored": from a snapshot, exec then means the restore's start
        self.snapshot: dict | None = None  # restored: the snapshot's own boot (edge/runtime/snapshot.py)

    def now_ms(self) -> float:
        return self.ms_at(time.clock_gettime(time.CLOCK_BOOTTIME))

    def ms_at(self, boottime_s: float) -> float:
        """A CLOCK_BOOTTIME instant as ms since exec."""
        return (boottime_s - self._exec_s) * 1000.0

    def add(self, name: str, start_ms: float, end_ms: float, **info) -> None:
        """Record a stage measured elsewhere (e.g. the interpreter's start-up)."""
        entry = {"stage": name, "start_ms": round(start_ms, 3), **info, "end_ms": round(end_ms, 3),
                 "duration_ms": round(end_ms - start_ms, 3)}
        with self._lock:
            self._stages.append(entry)

    @contextmanager
    def stage(self, name: str, **info):
        entry: dict = {"stage": name, "start_ms": round(self.now_ms(), 3)}
        entry.update(info)
        try:
            yield entry
        finally:
            entry["end_ms"] = round(self.now_ms(), 3)
            entry["duration_ms"] = round(entry["end_ms"] - entry["start_ms"], 3)
            with self._lock:
                self._stages.append(entry)

    def mark_ready(self) -> float:
        self.ready_ms = round(self.now_ms(), 3)
        return self.ready_ms

    def as_dict(self) -> dict:
        with self._lock:
            stages = sorted(self._stages, key=lambda s: s["start_ms"])
        out: dict = {"stages": stages, "exec_to_ready_ms": self.ready_ms, "pid": os.getpid(), "start": self.start}
        if self.snapshot is not None:
            out["snapshot"] = self.snapshot
        return out
