"""Device telemetry: GPU load and clocks, temperatures, power rails, memory, the power mode,
CPU frequencies and load, read on a thread of their own and added to the ``stats`` reply
(docs/telemetry.md).

    sysfs.py        the kernel's files: devfreq (Jetson GPU), thermal zones, INA3221, CPU, /proc/self
    system.py       Jetson or not, L4T release, /proc/meminfo, nvpmodel
    jtop_source.py  jetson-stats' jtop service, optional (the ``jetson`` extra), never required
    nvml.py         NVML through ctypes on a discrete GPU (the driver's library, no dependency)
    sampler.py      the daemon thread that samples every ``--telemetry-interval`` s; ``latest()`` reads nothing

Standard library only. The runtime imports this after READY (:func:`start_sampler`), so
neither the boot nor a request pays for it.
"""

from __future__ import annotations

from edge.observability.telemetry.jtop_source import JtopSource
from edge.observability.telemetry.nvml import NvmlSource
from edge.observability.telemetry.sampler import DEFAULT_INTERVAL_S, Sampler, read_all

__all__ = ["DEFAULT_INTERVAL_S", "JtopSource", "NvmlSource", "Sampler", "read_all", "start_sampler"]


def start_sampler(server, interval_s: float, root: str = "/") -> Sampler | None:
    """Start sampling every ``interval_s`` and have ``server``'s ``stats`` carry ``telemetry``;
    None (nothing started) when ``interval_s`` is 0."""
    if interval_s <= 0:
        return None
    sampler = Sampler(interval_s, root).start()
    server.extra_stats = sampler.stats_fields
    return sampler
