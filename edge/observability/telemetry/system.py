"""Readers of what the device is and how it is set: Jetson or not, L4T release, memory, the
nvpmodel power mode. Same contract as :mod:`edge.observability.telemetry.sysfs`: ``root`` injectable,
plain values, ``None`` plus a reason in ``absent`` for what is missing, never an exception.

Inside the OCI bundle only /proc and /sys are the host's: /etc/nv_tegra_release,
/etc/nvpmodel.conf and /var/lib/nvpmodel/status are host files the bundle does not mount, so
there the device is recognised by its device tree and the power mode is absent (jtop's
service, when reachable, still reports it).
"""

from __future__ import annotations

import os
import re

from edge.system.l4t import l4t_release
from edge.observability.telemetry.sysfs import read_text, shown

__all__ = ["read_device", "read_memory", "read_nvpmodel", "NVPMODEL_CONFS"]

_COMPATIBLE = ("proc/device-tree/compatible", "sys/firmware/devicetree/base/compatible")
_MODEL = ("proc/device-tree/model", "sys/firmware/devicetree/base/model")
# Where NVIDIA's nvpmodel looks for its configuration, in its order.
NVPMODEL_CONFS = ("odm/etc/nvpmodel.conf", "vendor/etc/nvpmodel.conf", "etc/nvpmodel.conf")
_POWER_MODEL = re.compile(r"^<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=(\S+?)\s*>", re.M)
_PM_DEFAULT = re.compile(r"^<\s*PM_CONFIG\s+DEFAULT=(\d+)\s*>", re.M)
_PMODE = re.compile(r"pmode:(\d+)")


def _first(root: str, candidates) -> tuple[str | None, str | None]:
    """(text, path) of the first readable file of ``candidates`` (paths under ``root``)."""
    for rel in candidates:
        path = os.path.join(root, rel)
        try:
            return read_text(path), path
        except OSError:
            continue
    return None, None


def read_device(root: str = "/", absent: dict | None = None) -> dict:
    """``{"jetson", "model", "l4t", "compatible"}``: a Jetson is a machine with
    /etc/nv_tegra_release or a device tree compatible with ``nvidia,tegra*``."""
    absent = {} if absent is None else absent
    compatible_text, _ = _first(root, _COMPATIBLE)
    compatible = [c for c in (compatible_text or "").split("\0") if c]
    model, _ = _first(root, _MODEL)
    out: dict = {"jetson": False, "model": model or None, "l4t": None, "compatible": compatible or None}
    release = os.path.join(root, "etc/nv_tegra_release")
    try:
        out["l4t"] = l4t_release(read_text(release))
        if out["l4t"] is None:
            absent["device.l4t"] = f"{shown(root, release)}: no '# R<major> (release), REVISION: <minor>' line"
        release_found = True
    except OSError as exc:
        release_found = False
        absent["device.l4t"] = f"{shown(root, release)}: {exc.strerror or type(exc).__name__}"
    out["jetson"] = release_found or any(c.startswith("nvidia,tegra") for c in compatible)
    if not compatible and model is None:
        absent["device.tree"] = "no device tree (/proc/device-tree): not an ARM board, or not mounted"
    return out


def read_memory(root: str = "/", jetson: bool = False, absent: dict | None = None) -> dict | None:
    """/proc/meminfo in bytes. On a Jetson the CPU and the GPU share this memory (``unified``):
    what the GPU allocates is taken from MemAvailable."""
    absent = {} if absent is None else absent
    path = os.path.join(root, "proc/meminfo")
    try:
        with open(path, "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError as exc:
        absent["memory"] = f"{shown(root, path)}: {exc.strerror or type(exc).__name__}"
        return None
    kib = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            kib[key.strip()] = int(fields[0]) * (1024 if fields[1:2] == ["kB"] else 1)
    out: dict = {}
    for key, name in (("MemTotal", "total_bytes"), ("MemAvailable", "available_bytes"),
                      ("SwapTotal", "swap_total_bytes"), ("SwapFree", "swap_free_bytes"),
                      ("NvMapMemUsed", "nvmap_used_bytes")):  # nvmap: older L4T's GPU buffers
        if key in kib:
            out[name] = kib[key]
        elif key != "NvMapMemUsed":
            out[name] = None
            absent[f"memory.{name}"] = f"{shown(root, path)}: no {key}"
    if out["total_bytes"] is not None and out["available_bytes"] is not None:
        out["used_bytes"] = out["total_bytes"] - out["available_bytes"]
    out["unified"] = bool(jetson)  # CPU + GPU share it
    return out


_conf_cache: dict[tuple, tuple[dict[int, str], int | None]] = {}  # (path, mtime, size) -> names, default


def parse_power_models(text: str) -> tuple[dict[int, str], int | None]:
    """Mode id -> name and the default id, from an nvpmodel.conf's text (also edge doctor's reading)."""
    m = _PM_DEFAULT.search(text)
    return {int(i): name for i, name in _POWER_MODEL.findall(text)}, int(m.group(1)) if m else None


def _power_models(path: str) -> tuple[dict[int, str], int | None]:
    """:func:`parse_power_models` of the file at ``path``, parsed once per version of the file."""
    st = os.stat(path)
    key = (path, st.st_mtime_ns, st.st_size)
    if key not in _conf_cache:
        with open(path, "rb") as f:
            text = f.read(4 << 20).decode("utf-8", "replace")
        _conf_cache.clear()  # one file is in use at a time
        _conf_cache[key] = parse_power_models(text)
    return _conf_cache[key]


def read_nvpmodel(root: str = "/", absent: dict | None = None) -> dict | None:
    """The power mode: ``{"id", "name", "default_id"}`` from /var/lib/nvpmodel/status
    (``pmode:0000``) and the POWER_MODEL names of nvpmodel.conf."""
    absent = {} if absent is None else absent
    status = os.path.join(root, "var/lib/nvpmodel/status")
    try:
        m = _PMODE.search(read_text(status))
    except OSError as exc:
        absent["nvpmodel"] = (f"{shown(root, status)}: {exc.strerror or type(exc).__name__} (not a Jetson, nvpmodel "
                              "never ran, or not mounted in the bundle)")
        return None
    if m is None:
        absent["nvpmodel"] = f"{shown(root, status)}: no pmode:<id>"
        return None
    out: dict = {"id": int(m.group(1)), "name": None, "default_id": None}
    for rel in NVPMODEL_CONFS:
        path = os.path.join(root, rel)
        try:
            names, default = _power_models(path)
        except OSError:
            continue
        out["name"], out["default_id"] = names.get(out["id"]), default
        if out["name"] is None:
            absent["nvpmodel.name"] = f"{shown(root, path)}: no POWER_MODEL ID={out['id']}"
        break
    else:
        absent["nvpmodel.name"] = f"no nvpmodel.conf ({', '.join('/' + c for c in NVPMODEL_CONFS)})"
    return out
