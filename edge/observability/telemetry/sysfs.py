"""Readers of the kernel's own files: the Jetson GPU's devfreq node, thermal zones, the
INA3221 power monitors, CPU frequencies and load, and the process's memory.

Every reader takes ``root`` (default ``/``) so tests run on a fixture tree, returns plain
dicts and numbers, and never raises: what is missing or unreadable comes back as ``None``
(or is left out of a mapping) with the reason in ``absent`` (name -> why), the paths in the
reasons written as they are on the device (``/sys/...``, whatever ``root`` is). The files are
small and sysfs answers from memory, except the INA3221 (an I2C read per file, well under a
millisecond each): this runs on the sampler's thread, never on a request's.

Units are the kernel's where they are exact (Hz, kHz, mV, mA, bytes) and said in every key;
temperatures are °C and power W (derived).
"""

from __future__ import annotations

import os
import re

__all__ = ["GPU_NAMES", "read_gpu", "read_thermal", "read_power", "read_cpu", "read_cpu_times", "read_process",
           "shown", "read_text", "read_int"]

# Names of the integrated GPU's platform device (the devfreq node's name after the unit
# address, its device's of_node/name, or its driver): Orin (ga10b; "gpu" from L4T 36 on, as in
# 17000000.gpu), Xavier (gv11b), TX2 (gp10b), Nano and TX1 (gm20b; 57000000.gpu), and the
# nvgpu driver's own name (gk20a).
GPU_NAMES = frozenset({"ga10b", "gv11b", "gp10b", "gm20b", "gk20a", "gpu", "gpu.0"})


def shown(root: str, path: str) -> str:
    """``path`` as it is on the device: ``root`` taken off, so reasons read the same on a fixture."""
    rel = os.path.relpath(path, root)
    return "/" if rel == "." else "/" + rel


def read_text(path: str) -> str:
    """A small file's text, trailing NULs (device-tree strings) and whitespace stripped; OSError as open() raises it."""
    with open(path, "rb") as f:
        data = f.read(65536)
    return data.decode("utf-8", "replace").strip().strip("\0").strip()


def read_int(path: str) -> int:
    """An integer file (OSError, ValueError)."""
    return int(read_text(path).split()[0])


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    return f"{type(exc).__name__}: {exc}"[:120]


def _numbered(names, prefix: str) -> list[tuple[int, str]]:
    """``prefix<N>`` entries of ``names`` as (N, name), sorted by N (thermal_zone10 after 9)."""
    out = []
    for name in names:
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            out.append((int(name[len(prefix):]), name))
    return sorted(out)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


# ------------------------------------------------------------------ GPU (devfreq)


def _gpu_names(node: str, entry: str) -> set[str]:
    """What this devfreq node says it is: its name without the unit address, its device's
    device-tree node name, its driver's name."""
    names = {entry, entry.split(".", 1)[-1]}
    try:
        names.add(read_text(os.path.join(node, "device", "of_node", "name")))
    except OSError:
        pass
    driver = os.path.join(node, "device", "driver")
    if os.path.islink(driver):
        names.add(os.path.basename(os.path.realpath(driver)))
    return names


def read_gpu(root: str = "/", absent: dict | None = None) -> dict | None:
    """The Jetson GPU's load (``device/load``: tenths of a percent) and clocks (Hz) from its devfreq node."""
    absent = {} if absent is None else absent
    base = os.path.join(root, "sys/class/devfreq")
    entries = sorted(_listdir(base))
    for entry in entries:
        node = os.path.join(base, entry)
        names = _gpu_names(node, entry)
        if not names & GPU_NAMES:
            continue
        matched = names & GPU_NAMES
        gpu: dict = {"devfreq": entry, "name": min(matched - {"gpu", "gpu.0"} or matched)}  # ga10b over gpu
        try:
            gpu["load_pct"] = read_int(os.path.join(node, "device", "load")) / 10.0
        except (OSError, ValueError, IndexError) as exc:
            gpu["load_pct"] = None
            absent["gpu.load"] = f"{shown(root, os.path.join(node, 'device', 'load'))}: {_why(exc)}"
        for key in ("cur_freq", "min_freq", "max_freq"):
            try:
                gpu[f"{key}_hz"] = read_int(os.path.join(node, key))
            except (OSError, ValueError, IndexError) as exc:
                gpu[f"{key}_hz"] = None
                absent[f"gpu.{key}"] = f"{shown(root, os.path.join(node, key))}: {_why(exc)}"
        try:
            gpu["governor"] = read_text(os.path.join(node, "governor"))
        except OSError:
            pass
        return gpu
    where = shown(root, base)
    absent["gpu"] = (f"no devfreq node of a Jetson GPU ({', '.join(sorted(GPU_NAMES))}) under {where}" if entries
                     else f"{where} is empty or missing (not a Jetson)")
    return None


# ------------------------------------------------------------------ thermal zones


def read_thermal(root: str = "/", absent: dict | None = None) -> dict | None:
    """Thermal zones by type: °C (``temp`` is millidegrees). A type seen twice gets its zone's number."""
    absent = {} if absent is None else absent
    base = os.path.join(root, "sys/class/thermal")
    zones = _numbered(_listdir(base), "thermal_zone")
    out: dict[str, float] = {}
    for n, zone in zones:
        path = os.path.join(base, zone)
        try:
            kind = read_text(os.path.join(path, "type")) or zone
        except OSError:
            kind = zone
        try:
            value = read_int(os.path.join(path, "temp")) / 1000.0
        except (OSError, ValueError, IndexError) as exc:  # EAGAIN/ENODATA: a sensor not ready or powered off
            absent[f"thermal.{kind}"] = f"{shown(root, os.path.join(path, 'temp'))}: {_why(exc)}"
            continue
        out[kind if kind not in out else f"{kind}#{n}"] = value
    if not out:
        if not zones:
            absent["thermal"] = f"no thermal_zone* under {shown(root, base)}"
        return None
    return out


# ------------------------------------------------------------------ power (INA3221)


def _ina3221_dirs(root: str) -> list[tuple[str, str]]:
    """(chip, hwmon dir) of every INA3221: through its I2C driver, and the hwmon class by name."""
    found: dict[str, tuple[str, str]] = {}
    drivers = os.path.join(root, "sys/bus/i2c/drivers/ina3221")
    for chip in sorted(_listdir(drivers)):
        hwmon = os.path.join(drivers, chip, "hwmon")
        for _, name in _numbered(_listdir(hwmon), "hwmon"):
            path = os.path.join(hwmon, name)
            found.setdefault(os.path.realpath(path), (chip, path))
    hwmon_class = os.path.join(root, "sys/class/hwmon")
    for _, name in _numbered(_listdir(hwmon_class), "hwmon"):
        path = os.path.join(hwmon_class, name)
        try:
            if read_text(os.path.join(path, "name")) != "ina3221":
                continue
        except OSError:
            continue
        found.setdefault(os.path.realpath(path), (name, path))
    return list(found.values())


def read_power(root: str = "/", absent: dict | None = None) -> dict | None:
    """INA3221 rails by label: ``voltage_mv`` (bus voltage, ``in<N>_input``), ``current_ma``
    (``curr<N>_input``) and ``power_w`` (their product). Rails overlap (VDD_IN is the module's
    input, the others are parts of it): do not add them up."""
    absent = {} if absent is None else absent
    chips = _ina3221_dirs(root)
    if not chips:
        absent["power"] = ("no INA3221 power monitor (/sys/bus/i2c/drivers/ina3221/*/hwmon, /sys/class/hwmon/* "
                           "named ina3221)")
        return None
    rails: dict[str, dict] = {}
    for chip, path in chips:
        for n, name in _numbered([f[:-len("_label")] for f in _listdir(path) if f.endswith("_label")], "in"):
            try:
                label = read_text(os.path.join(path, f"{name}_label"))
            except OSError:
                continue
            if not label:
                continue
            key = label if label not in rails else f"{label}@{chip}"
            rail: dict = {}
            for field, file in (("voltage_mv", f"in{n}_input"), ("current_ma", f"curr{n}_input")):
                try:
                    rail[field] = read_int(os.path.join(path, file))
                except (OSError, ValueError, IndexError) as exc:
                    rail[field] = None
                    absent[f"power.{key}.{field}"] = f"{shown(root, os.path.join(path, file))}: {_why(exc)}"
            v, i = rail["voltage_mv"], rail["current_ma"]
            rail["power_w"] = round(v * i / 1e6, 3) if v is not None and i is not None else None
            rails[key] = rail
    if not rails:
        absent["power"] = "INA3221 found, but no labelled channel (in<N>_label)"
        return None
    return rails


# ------------------------------------------------------------------ CPU


def _cpu_list(text: str) -> list[int]:
    """``0-3,5`` -> [0, 1, 2, 3, 5] (the kernel's cpulist format)."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def read_cpu(root: str = "/", absent: dict | None = None) -> dict | None:
    """Online CPUs (nvpmodel takes cores offline) and each one's current frequency (kHz)."""
    absent = {} if absent is None else absent
    base = os.path.join(root, "sys/devices/system/cpu")
    try:
        online = _cpu_list(read_text(os.path.join(base, "online")))
    except (OSError, ValueError) as exc:
        absent["cpu"] = f"{shown(root, os.path.join(base, 'online'))}: {_why(exc)}"
        return None
    out: dict = {"online": online, "freq_khz": {}}
    try:
        out["present"] = len(_cpu_list(read_text(os.path.join(base, "present"))))
    except (OSError, ValueError):
        pass
    for cpu in online:
        try:
            out["freq_khz"][str(cpu)] = read_int(os.path.join(base, f"cpu{cpu}", "cpufreq", "scaling_cur_freq"))
        except (OSError, ValueError, IndexError):
            continue
    if not out["freq_khz"]:
        out["freq_khz"] = None
        absent["cpu.freq_khz"] = f"no {shown(root, os.path.join(base, 'cpu*/cpufreq/scaling_cur_freq'))} (no cpufreq)"
    return out


def read_cpu_times(root: str = "/") -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat's ``cpu`` line; None when unreadable.
    Busy is everything but idle and iowait; a load is the ratio of two samples' differences."""
    try:
        with open(os.path.join(root, "proc/stat"), "rb") as f:
            line = f.readline().split()
        if line[:1] != [b"cpu"]:
            return None
        ticks = [int(x) for x in line[1:9]]  # user nice system idle iowait irq softirq steal (guest is in user)
    except (OSError, ValueError):
        return None
    total = sum(ticks)
    return total - ticks[3] - (ticks[4] if len(ticks) > 4 else 0), total


_STATUS = re.compile(rb"^(VmRSS|VmHWM|Threads):\s+(\d+)", re.M)


def read_process(root: str = "/", absent: dict | None = None) -> dict | None:
    """This process: resident memory (bytes, now and peak) and threads, from /proc/self/status."""
    absent = {} if absent is None else absent
    path = os.path.join(root, "proc/self/status")
    try:
        with open(path, "rb") as f:
            found = dict(_STATUS.findall(f.read()))
    except OSError as exc:
        absent["process"] = f"{shown(root, path)}: {_why(exc)}"
        return None
    out = {}
    for key, name, scale in ((b"VmRSS", "rss_bytes", 1024), (b"VmHWM", "rss_peak_bytes", 1024),
                             (b"Threads", "threads", 1)):
        if key in found:
            out[name] = int(found[key]) * scale
    return out or None
