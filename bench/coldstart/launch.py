"""Start one process (runtime, bundle, baseline) and time exec to its first correct reply.

The clock: CLOCK_BOOTTIME in ns taken just before ``Popen`` (exec), passed to the child as
``EDGE_EXEC_BOOTTIME_NS`` so the runtime's timeline ("ms since exec") and ours share one
origin; the end is when the reply has been decoded and its embedding matched the reference
(cosine >= :data:`MIN_COSINE`).

This module holds what every run shares (the clock, the result, the check of an
embedding); the runs themselves: ``runtime_runs`` (the runtime as a process, the bundle
under runc), ``script_runs`` (sentence-transformers, import probes); the lean client that
asks for the first reply: ``client``.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["MIN_COSINE", "STOP_TIMEOUT_S", "RunFailed", "RunResult", "clean_env", "cosine", "decode_f32le", "start_timed",
           "log_tail", "now_ns"]

MIN_COSINE = 0.9999
STOP_TIMEOUT_S = 20.0


class RunFailed(RuntimeError):
    """A run that gave no correct reply; the message says why (with the child's log tail)."""


@dataclass
class RunResult:
    kind: str  # "runtime" | "bundle" | "baseline" | "import_probe"
    total_ms: float  # exec to first correct reply (ms)
    phases: dict = field(default_factory=dict)  # name -> [start_ms, end_ms] since our exec
    timeline: dict | None = None  # the runtime's own boot timeline (from `stats`)
    reply: dict = field(default_factory=dict)  # reply metadata (engine, hashes, buckets, ...)
    cosine: float | None = None
    pid: int | None = None
    mapped_files: list[str] = field(default_factory=list)  # /proc/PID/maps while serving (runtime only)
    listed_files: list[str] = field(default_factory=list)  # files a --list-files child reported
    embedding_b64: str | None = None  # the baseline's embedding (float32 LE, base64): the reference

    def as_dict(self) -> dict:
        d = {"kind": self.kind, "total_ms": round(self.total_ms, 3), "phases": self.phases,
             "cosine": self.cosine, "pid": self.pid}
        if self.timeline is not None:
            d["timeline"] = self.timeline
        if self.reply:
            d["reply"] = self.reply
        return d


def now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def decode_f32le(buf: bytes) -> array:
    a = array("f")
    a.frombytes(buf)
    if sys.byteorder == "big":
        a.byteswap()
    return a


def cosine(a, b) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


def log_tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def clean_env(extra: dict) -> dict:
    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)  # never tell our own service manager that the runtime is ready
    env.update(extra)
    return env


def start_timed(cmd: list[str], workdir: Path, log: Path) -> tuple[subprocess.Popen, int]:
    """Exec ``cmd`` in ``workdir`` with the runtime's environment (output to ``log``); the process
    and the clock taken just before the exec, which the child gets as EDGE_EXEC_BOOTTIME_NS."""
    from edge.runtime.launch import boot_env

    with open(log, "wb") as out:
        t0 = now_ns()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=workdir,
                                env=boot_env(clean_env({"EDGE_EXEC_BOOTTIME_NS": str(t0)})))
    return proc, t0
