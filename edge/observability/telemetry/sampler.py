"""The sampler: one daemon thread reads every source each ``interval_s`` and keeps the last
sample; :meth:`Sampler.latest` hands it out without any I/O, so ``stats`` costs the same with
telemetry on (a dict merged into the reply) and never waits on sysfs, I2C, jtop or NVML.

The sample is built whole on the sampler's thread and then published by one assignment (a
new dict each time, never changed after), so a reader sees either the old sample or the new
one. The thread sleeps between samples (an Event wait: no spinning) and is started after
READY (``edge/boot.py``), never on the boot path.
"""

from __future__ import annotations

import threading
import time

from edge.config.env import DEFAULT_TELEMETRY_INTERVAL_S as DEFAULT_INTERVAL_S
from edge.observability.telemetry.jtop_source import JtopSource
from edge.observability.telemetry.nvml import NvmlSource
from edge.observability.telemetry.sysfs import read_cpu, read_cpu_times, read_gpu, read_power, read_process, read_thermal
from edge.observability.telemetry.system import read_device, read_memory, read_nvpmodel

__all__ = ["Sampler", "read_all", "DEFAULT_INTERVAL_S"]


def read_all(root: str = "/", jtop: JtopSource | None = None, nvml: NvmlSource | None = None) -> dict:
    """One sample of every source (does the I/O; never raises for a missing file).

    Every section's key is always there: its reading, or None with the reason in ``absent``.
    ``sources`` says per source ``ok`` or why it is off.
    """
    absent: dict[str, str] = {}
    device = read_device(root, absent)
    out: dict = {
        "device": device,
        "gpu": read_gpu(root, absent),
        "thermal_c": read_thermal(root, absent),
        "power": read_power(root, absent),
        "memory": read_memory(root, device["jetson"], absent),
        "nvpmodel": read_nvpmodel(root, absent),
        "cpu": read_cpu(root, absent),
        "process": read_process(root, absent),
    }
    sources = {"sysfs": "ok"}
    out["jtop"] = _optional(jtop, "jtop", sources, absent)
    if device["jetson"]:
        sources["nvml"] = absent["nvml"] = "off on a Jetson: the integrated GPU is read from devfreq"
        out["nvml"] = None
    else:
        out["nvml"] = _optional(nvml, "nvml", sources, absent)
    out["sources"] = sources
    out["absent"] = absent
    return out


def _optional(source, name: str, sources: dict, absent: dict):
    if source is None:
        sources[name] = absent[name] = "not enabled"
        return None
    try:
        value = source.read()
    except Exception as exc:  # a source must not end the sample
        value, source.status = None, f"{type(exc).__name__}: {exc}"[:200]
    sources[name] = source.status
    if value is None:
        absent[name] = source.status
    return value


class Sampler:
    """Reads :func:`read_all` every ``interval_s`` on a daemon thread; :meth:`latest` is free."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, root: str = "/", jtop: JtopSource | None = None,
                 nvml: NvmlSource | None = None) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0 (0 means no sampler at all)")
        self.interval_s = interval_s
        self.root = root
        self.jtop = jtop if jtop is not None else JtopSource(root)
        self.nvml = nvml if nvml is not None else NvmlSource()
        self.samples = 0  # samples taken
        self.failures = 0  # samples that raised (logged once each; the last good one stays)
        # (sample, its time.monotonic()): published by one assignment, never mutated after
        self._published: tuple[dict, float] | None = None
        self._cpu_times: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ any thread, no I/O

    def latest(self) -> dict | None:
        """The last sample with its age (ms), or None before the first; reads no file."""
        published = self._published
        if published is None:
            return None
        last, at = published
        return {**last, "age_ms": round((time.monotonic() - at) * 1000.0, 1)}

    def stats_fields(self) -> dict:
        """The ``stats`` reply's extra fields (``IpcServer.extra_stats``): ``{"telemetry": ...}``."""
        last = self.latest()
        if last is None:
            return {"telemetry": {"interval_s": self.interval_s, "samples": 0, "pending": "no sample yet"}}
        return {"telemetry": last}

    # ------------------------------------------------------------ the thread

    def start(self) -> "Sampler":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="edge-telemetry", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        for source in (self.jtop, self.nvml):
            try:
                source.close()
            except Exception:
                pass

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sample()
            except Exception:  # a bug in a reader: keep the last sample and go on
                self.failures += 1
                from edge.system.log import log_exception

                log_exception("telemetry.sample_failed", level="warning", failures=self.failures)
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def sample(self) -> dict:
        """Read every source now (on the calling thread), publish and return the sample."""
        t0 = time.monotonic()
        wall = time.time()
        sample = read_all(self.root, self.jtop, self.nvml)
        times = read_cpu_times(self.root)
        if sample["cpu"] is not None:
            sample["cpu"]["load_pct"] = self._cpu_load(times)
        self._cpu_times = times
        now = time.monotonic()
        self.samples += 1
        sample.update(interval_s=self.interval_s, samples=self.samples, at=round(wall, 3),
                      read_ms=round((now - t0) * 1000.0, 3))
        self._published = sample, now
        return sample

    def _cpu_load(self, times: tuple[int, int] | None) -> float | None:
        """Busy share of all CPUs (%) since the previous sample; None on the first."""
        before = self._cpu_times
        if times is None or before is None or times[1] <= before[1]:
            return None
        return round(100.0 * (times[0] - before[0]) / (times[1] - before[1]), 1)
