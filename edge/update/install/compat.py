"""Whether a bundle fits this device: architecture, L4T release, device-tree model, free space.

What the device is (:class:`DeviceFacts`) is read from the root being installed into:

* arch: ``ROOT/etc/edge/device.json``'s ``"arch"`` when that file exists (a root that is not this
  machine's: a rootfs prepared on a build host for flashing, a test root); else, for a root
  other than ``/``, the ELF machine of ``ROOT/bin/sh``; else ``uname -m``.
* L4T: ``ROOT/etc/nv_tegra_release`` (``# R36 (release), REVISION: 3.0, ...`` is ``36.3.0``).
* device: the NUL-separated strings of ``ROOT/proc/device-tree/compatible``.

A manifest that asks for an L4T range or device strings is refused on a root that has no such
file: a bundle built for a Jetson does not run elsewhere.
"""

from __future__ import annotations

import json
import os
import platform

from edge.system.elf import elf_machine
from edge.system.l4t import l4t_in_range, l4t_release
from edge.update.install.errors import Refused
from edge.update.install.layout import DeviceLayout

__all__ = ["DeviceFacts", "device_facts", "check_compatible", "check_space", "SPACE_MARGIN"]

SPACE_MARGIN = 0.10  # beyond unpacked_bytes: directory blocks, the last block of each file, the manifest


class DeviceFacts:
    def __init__(self, arch: str, arch_from: str, l4t: str | None, compatible: list[str] | None) -> None:
        self.arch = arch
        self.arch_from = arch_from  # where arch was read: the message names it
        self.l4t = l4t  # "36.3.0"; None: no nv_tegra_release
        self.compatible = compatible  # None: no device tree


def device_facts(layout: DeviceLayout) -> DeviceFacts:
    arch, arch_from = None, None
    if layout.device_json.exists():
        try:
            arch = json.loads(layout.device_json.read_text()).get("arch")
        except (OSError, ValueError, AttributeError) as exc:
            raise Refused("compatibility", f"{layout.device_json} is not a JSON object ({exc})") from None
        arch_from = f"{layout.device_json} arch"
    if arch is None and not layout.is_system_root:
        arch = elf_machine(layout.root / "bin/sh")
        arch_from = f"the ELF machine of {layout.root / 'bin/sh'}"
    if arch is None:
        arch, arch_from = platform.machine(), "uname -m"
    assert arch_from is not None  # set with arch, by one of the three above
    l4t = None
    try:
        l4t = l4t_release(layout.nv_tegra_release.read_text(errors="replace")) or "unknown"
    except OSError:
        pass
    try:
        compatible = [s for s in layout.dt_compatible.read_bytes().decode(errors="replace").split("\0") if s]
    except OSError:
        compatible = None
    return DeviceFacts(arch, arch_from, l4t, compatible)


def _range(l4t) -> str:
    return f"{l4t.min or 'any'}-{l4t.max or 'any'}"


def check_compatible(manifest, facts: DeviceFacts) -> None:
    want = manifest.compatible
    if want.arch != facts.arch:
        raise Refused("compatibility", f"the bundle is built for {want.arch}, this device is {facts.arch} "
                                       f"({facts.arch_from})")
    if want.l4t is not None:
        if facts.l4t is None:
            raise Refused("compatibility", f"the bundle needs L4T {_range(want.l4t)}, and this root has no "
                                           f"etc/nv_tegra_release (not a Jetson)")
        if facts.l4t == "unknown" or not l4t_in_range(facts.l4t, want.l4t.min, want.l4t.max):
            raise Refused("compatibility", f"the bundle needs L4T {_range(want.l4t)}, this device runs "
                                           f"{facts.l4t}")
    if want.devices:
        if not facts.compatible:
            raise Refused("compatibility", f"the bundle is for the devices {want.devices}, and this root has no "
                                           f"proc/device-tree/compatible")
        if not set(want.devices) & set(facts.compatible):
            raise Refused("compatibility", f"the bundle is for the devices {want.devices}, this device is "
                                           f"{facts.compatible}")


def check_space(layout: DeviceLayout, unpacked_bytes: int, assume_free: int | None = None) -> int:
    """The bytes the unpack needs (raises Refused("space") when the slots' file system has less
    free); ``assume_free`` replaces statvfs's answer (tests only)."""
    need = unpacked_bytes + int(unpacked_bytes * SPACE_MARGIN)
    where = layout.slots_dir
    while not where.exists() and where != where.parent:
        where = where.parent
    if assume_free is None:
        st = os.statvfs(where)
        free, how = st.f_bavail * st.f_frsize, "free"
    else:
        free, how = assume_free, "free (--assume-free)"
    if free < need:
        raise Refused("space", f"the bundle needs {_mib(need)} ({_mib(unpacked_bytes)} and "
                               f"{SPACE_MARGIN:.0%} margin), the file system of {where} has {_mib(free)} {how}")
    return need


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
