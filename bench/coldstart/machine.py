"""Facts about the machine a record was measured on: CPU, memory, kernel, Jetson model and power mode."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

__all__ = ["machine_facts", "load_average"]

_DISTS = ("onnxruntime", "onnxruntime-gpu", "torch", "sentence-transformers", "transformers", "pyzmq", "numpy",
          "pydantic", "edge")


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(errors="replace").strip("\x00\n ")
    except OSError:
        return None


def _cpu_model() -> str | None:
    text = _read("/proc/cpuinfo") or ""
    for key in ("model name", "Hardware", "Processor", "cpu model"):
        for line in text.splitlines():
            if line.lower().startswith(key.lower()) and ":" in line:
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


def _mem_total_bytes() -> int | None:
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


def _nvpmodel() -> str | None:
    exe = shutil.which("nvpmodel")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "-q"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip() and "NVPM WARN" not in ln]
    return " / ".join(lines) or None


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _versions() -> dict:
    out = {}
    for dist in _DISTS:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def machine_facts() -> dict:
    uname = os.uname()
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    facts = {
        "hostname": uname.nodename,
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "arch": uname.machine,
        "memory_bytes": _mem_total_bytes(),
        "kernel": f"{uname.sysname} {uname.release} {uname.version}",
        "python": sys.version.split()[0],
        "load_average_start": load_average(),
        "versions": _versions(),
        # Jetson: empty (None) elsewhere.
        "jetson_model": _read("/proc/device-tree/model"),
        "l4t_release": (_read("/etc/nv_tegra_release") or "").splitlines()[0] if _read("/etc/nv_tegra_release") else None,
        "nvpmodel": _nvpmodel(),
    }
    return facts
