"""The bundle's resource limits: the container's (config.json) and the unit's drop-in.

Derived from the sizes the build copies (docs/bundle.md, "Limits"): the mapped package and
the runtime's files are page cache charged to the container's cgroup, on top of the
runtime's own anonymous memory.
"""

from __future__ import annotations

from image.bundle import oci_config

__all__ = ["UNIT_DROPIN", "UNIT_MEMORY_OVERHEAD", "UNIT_TASKS_OVERHEAD", "resource_limits", "unit_dropin"]

UNIT_DROPIN = "edge.service.d/limits.conf"  # the unit's limits for this bundle, next to config.json
# What the unit holds beside the container: edge-supervise (python3, stdlib) and `runc run` (Go,
# about one thread per core), with `runc init` while it starts the container. Measured under
# systemd at READY (2 cores): 10 MiB and 10 tasks together; the rest is margin.
UNIT_MEMORY_OVERHEAD = 128 << 20  # bytes
UNIT_TASKS_OVERHEAD = 64


def resource_limits(package_bytes: int, runtime_bytes: int) -> dict:
    """The container's limits and the unit's (edge-bundle.json ``limits``), with how they were derived."""
    memory = oci_config.memory_limit(package_bytes + runtime_bytes)
    return {
        "memory_bytes": memory,  # config.json linux.resources.memory.limit
        "swap_bytes": 0,  # memory.swap = memory.limit: memory+swap may not exceed memory
        "memory_derivation": {"package_bytes": package_bytes, "runtime_bytes": runtime_bytes,
                              "headroom_bytes": oci_config.MEMORY_HEADROOM, "rounded_to": "MiB"},
        "pids": oci_config.PIDS_LIMIT,
        "nofile": oci_config.NOFILE,
        "unit_memory_max": memory + UNIT_MEMORY_OVERHEAD,
        "unit_tasks_max": oci_config.PIDS_LIMIT + UNIT_TASKS_OVERHEAD,
    }


def unit_dropin(limits: dict) -> str:
    """``edge.service.d/limits.conf``: the unit's limits for this bundle's package (docs/bundle.md, Install)."""
    d = limits["memory_derivation"]
    return "\n".join([
        "# Written by edge-bundle build: edge.service's limits for this bundle's package (docs/bundle.md).",
        f"# MemoryMax: the container's {limits['memory_bytes'] >> 20} MiB (config.json: package {d['package_bytes']} B",
        f"# + runtime files {d['runtime_bytes']} B + {d['headroom_bytes'] >> 20} MiB, rounded up to a MiB)",
        f"# + {UNIT_MEMORY_OVERHEAD >> 20} MiB for edge-supervise and runc.",
        f"# TasksMax: the container's {limits['pids']} + {UNIT_TASKS_OVERHEAD} for edge-supervise and runc.",
        "[Service]",
        f"MemoryMax={limits['unit_memory_max'] >> 20}M",
        f"TasksMax={limits['unit_tasks_max']}",
        ""])
