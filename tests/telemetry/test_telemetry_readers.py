"""The sysfs/procfs readers on fixture trees: an Orin Nano-like tree (exact values), an empty
tree, a root that does not exist, broken files, and this machine's own ``/``.

fixtures/orin is laid out as L4T 36 on an Orin Nano lays these files out: the GPU's devfreq
node (17000000.ga10b, ``device/load`` in tenths of a percent, ``device/of_node/name`` with
the device tree's trailing NUL), thermal zones (millidegrees), the INA3221 on I2C bus 1 at
0x40 with its hwmon class link, /proc/meminfo, the device tree, nvpmodel's status and conf,
nv_tegra_release; CPUs 4-5 offline as in the 7W mode.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgpack

from edge.observability.telemetry import read_all
from edge.observability.telemetry.sysfs import read_cpu, read_gpu, read_power, read_thermal
from edge.observability.telemetry.system import read_device, read_memory, read_nvpmodel

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ORIN = str(FIXTURES / "orin")
EMPTY = str(FIXTURES / "empty")
SECTIONS = {"device", "gpu", "thermal_c", "power", "memory", "nvpmodel", "cpu", "process", "jtop", "nvml", "sources",
            "absent"}


def test_orin_device():
    absent = {}
    assert read_device(ORIN, absent) == {
        "jetson": True, "model": "NVIDIA Jetson Orin Nano Developer Kit", "l4t": "36.3.0",
        "compatible": ["nvidia,p3768-0000+p3767-0005", "nvidia,p3767-0005", "nvidia,tegra234"]}
    assert absent == {}


def test_orin_gpu_is_the_ga10b_devfreq_node_not_the_vic():
    assert read_gpu(ORIN) == {"devfreq": "17000000.ga10b", "name": "ga10b", "load_pct": 45.3,
                              "cur_freq_hz": 306_000_000, "min_freq_hz": 306_000_000, "max_freq_hz": 624_750_000,
                              "governor": "nvhost_podgov"}


def test_orin_thermal_zones_in_celsius():
    assert read_thermal(ORIN) == {"CPU-therm": 45.5, "GPU-therm": 44.25, "tj-therm": 46.187}


def test_orin_power_rails_once_though_reached_twice():
    # the chip is reached through its I2C driver and through /sys/class/hwmon/hwmon1 (a link): one set of rails
    assert os.path.islink(os.path.join(ORIN, "sys/class/hwmon/hwmon1"))
    assert read_power(ORIN) == {
        "VDD_IN": {"voltage_mv": 5072, "current_ma": 1304, "power_w": 6.614},
        "VDD_CPU_GPU_CV": {"voltage_mv": 5064, "current_ma": 296, "power_w": 1.499},
        "VDD_SOC": {"voltage_mv": 5072, "current_ma": 704, "power_w": 3.571},
    }


def test_orin_memory_is_unified():
    assert read_memory(ORIN, jetson=True) == {
        "total_bytes": 7620200 * 1024, "available_bytes": 5123456 * 1024, "used_bytes": (7620200 - 5123456) * 1024,
        "swap_total_bytes": 3810096 * 1024, "swap_free_bytes": 3800000 * 1024, "nvmap_used_bytes": 262144 * 1024,
        "unified": True}


def test_orin_nvpmodel():
    assert read_nvpmodel(ORIN) == {"id": 1, "name": "7W", "default_id": 0}


def test_orin_cpus_offline_ones_left_out():
    assert read_cpu(ORIN) == {"online": [0, 1, 2, 3], "present": 6,
                              "freq_khz": {"0": 1510400, "1": 1510400, "2": 729600, "3": 729600}}


def test_orin_sample_whole():
    sample = read_all(ORIN)
    assert set(sample) == SECTIONS
    assert sample["absent"] == {"jtop": "not enabled", "nvml": "off on a Jetson: the integrated GPU is read from devfreq"}
    assert sample["process"] == {"rss_bytes": 153600 * 1024, "rss_peak_bytes": 204800 * 1024, "threads": 12}
    assert sample["sources"] == {"sysfs": "ok", "jtop": "not enabled",
                                 "nvml": "off on a Jetson: the integrated GPU is read from devfreq"}
    assert json.loads(json.dumps(sample)) == sample  # plain data: what the reply encodes
    assert msgpack.unpackb(msgpack.packb(sample)) == sample


def test_empty_tree_reports_everything_absent():
    for root in (EMPTY, os.path.join(EMPTY, "no-such-dir")):
        sample = read_all(root)
        assert set(sample) == SECTIONS
        for key in ("gpu", "thermal_c", "power", "memory", "nvpmodel", "cpu", "process", "jtop", "nvml"):
            assert sample[key] is None, key
        assert sample["device"] == {"jetson": False, "model": None, "l4t": None, "compatible": None}
        assert sample["absent"] == {
            "device.l4t": "/etc/nv_tegra_release: No such file or directory",
            "device.tree": "no device tree (/proc/device-tree): not an ARM board, or not mounted",
            "gpu": "/sys/class/devfreq is empty or missing (not a Jetson)",
            "thermal": "no thermal_zone* under /sys/class/thermal",
            "power": "no INA3221 power monitor (/sys/bus/i2c/drivers/ina3221/*/hwmon, /sys/class/hwmon/* named "
                     "ina3221)",
            "memory": "/proc/meminfo: No such file or directory",
            "nvpmodel": "/var/lib/nvpmodel/status: No such file or directory (not a Jetson, nvpmodel never ran, or "
                        "not mounted in the bundle)",
            "cpu": "/sys/devices/system/cpu/online: No such file or directory",
            "process": "/proc/self/status: No such file or directory",
            "jtop": "not enabled",
            "nvml": "not enabled",
        }


def test_this_machine():
    sample = read_all("/")
    assert set(sample) == SECTIONS
    assert sample["memory"]["total_bytes"] > 0 and sample["memory"]["available_bytes"] > 0
    assert sample["process"]["rss_bytes"] > 0
    assert sample["cpu"]["online"]
    names = {"gpu": "gpu", "thermal_c": "thermal", "power": "power", "nvpmodel": "nvpmodel", "jtop": "jtop"}
    for key, name in names.items():  # what this machine lacks says why
        if sample[key] is None:
            assert sample["absent"][name], key
    json.dumps(sample)


def _write(root: Path, rel: str, text: str | bytes) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())


def test_broken_files_are_absent_not_raised(tmp_path):
    # a GPU whose load is garbage and whose max_freq is a directory (as unreadable as EIO)
    _write(tmp_path, "sys/class/devfreq/17000000.gpu/device/load", "busy\n")
    _write(tmp_path, "sys/class/devfreq/17000000.gpu/cur_freq", "918000000\n")
    (tmp_path / "sys/class/devfreq/17000000.gpu/max_freq").mkdir()
    # thermal: one good zone, one whose sensor answers nothing, two of the same type
    for n, (kind, temp) in enumerate([("cpu-thermal", "51000"), ("gpu-thermal", ""), ("cpu-thermal", "52000")]):
        _write(tmp_path, f"sys/class/thermal/thermal_zone{n}/type", kind + "\n")
        _write(tmp_path, f"sys/class/thermal/thermal_zone{n}/temp", temp)
    # INA3221 found through the hwmon class only, one rail without its current file
    _write(tmp_path, "sys/class/hwmon/hwmon3/name", "ina3221\n")
    _write(tmp_path, "sys/class/hwmon/hwmon3/in1_label", "VDD_GPU_SOC\n")
    _write(tmp_path, "sys/class/hwmon/hwmon3/in1_input", "19104\n")
    _write(tmp_path, "sys/class/hwmon/hwmon0/name", "coretemp\n")
    # status without a mode; meminfo without MemAvailable
    _write(tmp_path, "var/lib/nvpmodel/status", "fmode:quiet\n")
    _write(tmp_path, "proc/meminfo", "MemTotal: 1000 kB\n")
    _write(tmp_path, "etc/nv_tegra_release", "not a release line\n")
    sample = read_all(str(tmp_path))
    assert sample["device"]["jetson"] is True and sample["device"]["l4t"] is None
    assert sample["gpu"] == {"devfreq": "17000000.gpu", "name": "gpu", "load_pct": None, "cur_freq_hz": 918000000,
                             "min_freq_hz": None, "max_freq_hz": None}
    assert sample["thermal_c"] == {"cpu-thermal": 51.0, "cpu-thermal#2": 52.0}
    assert sample["power"] == {"VDD_GPU_SOC": {"voltage_mv": 19104, "current_ma": None, "power_w": None}}
    assert sample["nvpmodel"] is None
    assert sample["memory"] == {"total_bytes": 1024000, "available_bytes": None, "swap_total_bytes": None,
                                "swap_free_bytes": None, "unified": True}
    absent = sample["absent"]
    assert absent["gpu.load"] == "/sys/class/devfreq/17000000.gpu/device/load: ValueError: invalid literal for " \
                                 "int() with base 10: 'busy'"
    assert absent["gpu.max_freq"] == "/sys/class/devfreq/17000000.gpu/max_freq: Is a directory"
    assert absent["gpu.min_freq"] == "/sys/class/devfreq/17000000.gpu/min_freq: No such file or directory"
    assert absent["thermal.gpu-thermal"].startswith("/sys/class/thermal/thermal_zone1/temp: IndexError")
    assert absent["power.VDD_GPU_SOC.current_ma"] == "/sys/class/hwmon/hwmon3/curr1_input: No such file or directory"
    assert absent["nvpmodel"] == "/var/lib/nvpmodel/status: no pmode:<id>"
    assert absent["memory.available_bytes"] == "/proc/meminfo: no MemAvailable"
    assert absent["device.l4t"] == "/etc/nv_tegra_release: no '# R<major> (release), REVISION: <minor>' line"


def test_nvpmodel_without_conf_and_with_unknown_id(tmp_path):
    _write(tmp_path, "var/lib/nvpmodel/status", "pmode:0003\n")
    absent = {}
    assert read_nvpmodel(str(tmp_path), absent) == {"id": 3, "name": None, "default_id": None}
    assert absent == {"nvpmodel.name": "no nvpmodel.conf (/odm/etc/nvpmodel.conf, /vendor/etc/nvpmodel.conf, "
                                       "/etc/nvpmodel.conf)"}
    _write(tmp_path, "etc/nvpmodel.conf", "< POWER_MODEL ID=0 NAME=MAXN >\n< PM_CONFIG DEFAULT=0 >\n")
    absent = {}
    assert read_nvpmodel(str(tmp_path), absent) == {"id": 3, "name": None, "default_id": 0}
    assert absent == {"nvpmodel.name": "/etc/nvpmodel.conf: no POWER_MODEL ID=3"}
    # the conf is parsed again when it changes (its parse is cached by mtime and size)
    _write(tmp_path, "etc/nvpmodel.conf", "< POWER_MODEL ID=3 NAME=MAXN_SUPER >\n< PM_CONFIG DEFAULT=3 >\n")
    assert read_nvpmodel(str(tmp_path)) == {"id": 3, "name": "MAXN_SUPER", "default_id": 3}


def test_gpu_found_by_driver_name(tmp_path):
    # devfreq node named by address only; the driver link names it
    _write(tmp_path, "sys/class/devfreq/dev0/device/load", "1000\n")
    _write(tmp_path, "sys/bus/platform/drivers/gv11b/.keep", "")
    os.symlink(tmp_path / "sys/bus/platform/drivers/gv11b", tmp_path / "sys/class/devfreq/dev0/device/driver")
    gpu = read_gpu(str(tmp_path))
    assert gpu["name"] == "gv11b" and gpu["load_pct"] == 100.0
