"""Where the installer keeps things under a device root (docs/archive.md, "On the device").

    ROOT/etc/edge/keys/*.pub                 trusted public keys
    ROOT/etc/edge/device.json                optional: {"arch": ...} for a root that is not this machine's
    ROOT/opt/edge/slots/{a,b}/               a slot: edge-archive.json, edge-archive.sig, bundle/
    ROOT/opt/edge/slots/X.staging/           an unpack in progress (removed when found by the next run)
    ROOT/opt/edge/slots/X.old/               a replaced slot being removed (likewise)
    ROOT/opt/edge/bundle/current             symlink ../slots/X/bundle: the live slot's bundle
    ROOT/var/lib/edge/install.json           the state (edge/update/install/state.py); its directory is the lock
    ROOT/var/cache/edge/<bundle_sha256>/     engine caches and snapshots, outside the slots (a convention)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

__all__ = ["DeviceLayout", "SlotName", "try_token", "SLOTS", "SLOT_MANIFEST", "SLOT_SIGNATURE", "SLOT_BUNDLE", "PACKAGE_IN_BUNDLE", "other_slot"]

SlotName = Literal["a", "b"]
SLOTS: tuple[SlotName, SlotName] = ("a", "b")  # at most two: the live one and the one an update goes to (or a rollback returns to)
SLOT_MANIFEST = "edge-archive.json"  # the signed manifest and its signature are kept in the slot:
SLOT_SIGNATURE = "edge-archive.sig"  # a slot can be checked again, and the state rebuilt from it
SLOT_BUNDLE = "bundle"
PACKAGE_IN_BUNDLE = "rootfs/opt/edge/package"  # the package directory, below a bundle (image/build_bundle.py)
STAGING_SUFFIX = ".staging"
OLD_SUFFIX = ".old"


def other_slot(name: str) -> SlotName:
    return SLOTS[1 - SLOTS.index(name)]


def try_token(trial: dict) -> bytes:
    """What names one trial in :attr:`DeviceLayout.try_taken_file`: its slot and when it began, as
    the state file has them (plain JSON), so a file left from an earlier trial never matches."""
    return f"{trial.get('slot')} {trial.get('since')}\n".encode()


class DeviceLayout:
    """The paths of one device root ("/" on the device; a directory in tests or for a rootfs
    being prepared for flashing)."""

    def __init__(self, root: Path | str = "/") -> None:
        self.root = Path(root)
        self.keys_dir = self.root / "etc/edge/keys"
        self.device_json = self.root / "etc/edge/device.json"
        self.nv_tegra_release = self.root / "etc/nv_tegra_release"
        self.dt_compatible = self.root / "proc/device-tree/compatible"
        self.slots_dir = self.root / "opt/edge/slots"
        self.bundle_dir = self.root / "opt/edge/bundle"
        self.current = self.bundle_dir / "current"
        self.state_dir = self.root / "var/lib/edge"
        self.state_file = self.state_dir / "install.json"
        # The trial's try that an install took for its own restart (edge-trial's ``try_token``):
        # the next start's pre-start consumes it instead of loading the state model (~150 ms).
        self.try_taken_file = self.state_dir / "install.try-taken"
        self.cache_root = self.root / "var/cache/edge"

    @property
    def is_system_root(self) -> bool:
        return os.path.realpath(self.root) == "/"

    def slot(self, name: str) -> Path:
        return self.slots_dir / name

    def staging(self, name: str) -> Path:
        return self.slots_dir / f"{name}{STAGING_SUFFIX}"

    def old(self, name: str) -> Path:
        return self.slots_dir / f"{name}{OLD_SUFFIX}"

    def cache_dir(self, bundle_sha256: str) -> Path:
        return self.cache_root / bundle_sha256

    @staticmethod
    def current_target(name: str) -> str:
        """What ``current`` points at: relative, so that a root prepared elsewhere (a rootfs for
        flashing, a test directory) is right once it is ``/``."""
        return f"../slots/{name}/{SLOT_BUNDLE}"

    def live_slot(self) -> tuple[SlotName | None, str | None]:
        """``(slot, None)`` when ``current`` is a symlink to a slot's bundle; ``(None, why)`` otherwise
        (``why`` is None when there is no ``current`` at all: nothing installed)."""
        try:
            target = os.readlink(self.current)
        except FileNotFoundError:
            return None, None
        except OSError:
            kind = "a directory" if self.current.is_dir() else "not a symlink"
            return None, f"{self.current} is {kind}, not the symlink edge-bundle install makes"
        for name in SLOTS:
            if target == self.current_target(name) or os.path.normpath(
                    os.path.join(self.bundle_dir, target)) == os.path.normpath(self.slot(name) / SLOT_BUNDLE):
                return name, None
        return None, f"{self.current} points at {target}, which is not a slot's bundle"

    def leftovers(self) -> list[Path]:
        """What a killed installer can leave: staging and replaced slots, temporary names."""
        found = []
        for name in SLOTS:
            found += [p for p in (self.staging(name), self.old(name)) if os.path.lexists(p)]
        for d in (self.bundle_dir, self.state_dir):
            try:
                found += [d / n for n in os.listdir(d) if n.startswith((".current.new-", ".install.json.tmp-"))]
            except FileNotFoundError:
                pass
        return found
