"""The device-side installer of signed bundle archives: two slots, an atomic switch of
``/opt/edge/bundle/current``, a state file with the update's trial (docs/archive.md).

    edge-bundle install FILE [--root DIR]   edge-bundle status [--root DIR] [--json]
    edge-bundle rollback [--root DIR]       edge-bundle mark-good [--root DIR]

Modules, one per stage or owner of state:

    cli.py        the subcommands' parsers and their exit statuses (registered by image/build_bundle.py)
    installer.py  install, rollback, mark-good: the stages in order, the crash points
    archive.py    the archive's format (edge/update/archive/ owns it), its errors as the installer's
    compat.py     arch, L4T, device tree, free space
    host_paths.py the host directories, socket, user and unit drop-in a bundle names: the allow-list
    unpack.py     members into the staging directory, each checked as it streams
    slots.py      the slots on disk; recover() after a killed run
    state.py      install.json: the pydantic model of slots, trial, history
    status.py     the status report, as text or JSON
    trial.py      edge-trial: the update's trial under systemd (pre-start, watch, on-failure)
    cache.py      /var/cache/edge/<bundle_sha256>/: removing the caches of bundles no slot holds
    layout.py     the paths under a root
    fsio.py       fsync, atomic write, atomic symlink switch, the lock
    errors.py     Refused / NotReady / RestartFailed, with exit statuses

The runtime never imports this package (its boot path stays free of pydantic and
cryptography); the names below load their module on first use.
"""

from __future__ import annotations

import importlib

__all__ = ["install", "rollback", "mark_good", "status", "recover", "check_slot", "DeviceLayout", "InstallState",
           "TrialStatus", "InstallError", "Refused", "NotReady", "RestartFailed"]

_WHERE = {
    "install": "installer", "rollback": "installer", "mark_good": "installer",
    "status": "status", "recover": "slots", "check_slot": "slots", "DeviceLayout": "layout",
    "InstallState": "state", "TrialStatus": "state",
    "InstallError": "errors", "Refused": "errors", "NotReady": "errors", "RestartFailed": "errors",
}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
