"""The install's snapshot before the switch (docs/update.md, "Snapshot before the switch").

Between filling the slot and switching ``current`` to it, while the old runtime still serves, the
new bundle boots to its snapshot point in a staging container and is checkpointed into its
cache (``ROOT/var/cache/edge/<bundle_sha256>/snapshot``), so that the start after the switch
restores it: the start the update's trial judges is then the one the device will use.

edge-supervise owns runc and CRIU (the start that restores it applies the same rule), so this
runs it as a command, ``python -m edge.supervise --stage-snapshot`` (edge/supervise/staging.py),
and reads its one ``supervise.staged`` line. Its container runs at the least CPU weight
(cpu.shares 2); measured: the live runtime's health p99 while it boots (docs/update.md).

A snapshot that cannot be taken never stops the install: it goes on, the first start is fresh,
and :class:`Staged` says why, for the slot's record (``edge-bundle status``), the history, the
journal and the trial (``edge selftest --snapshots``: a fresh start is then held to the
package's fresh-start budget).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from edge.update.install.layout import SLOT_BUNDLE, DeviceLayout

__all__ = ["STAGE_TIMEOUT_S", "START_RECORD", "Staged", "stage_snapshot", "journal"]

STAGE_TIMEOUT_S = 300.0  # the staging boot (edge-supervise: 120 s to the snapshot point) and the checkpoint
START_RECORD = "/run/edge-supervise/start.json"  # the live unit's (edge/supervise/start_record.py)


class Staged:
    """What became of the snapshot before the switch."""

    def __init__(self, taken: bool, detail: str, seconds: float = 0.0, record: dict | None = None,
                 began: float | None = None) -> None:
        self.taken = taken
        self.detail = detail  # one clause for a person: taken how, or why not
        self.seconds = seconds  # the whole staging, boot and checkpoint (s)
        self.record = record or {}  # edge-supervise's supervise.staged line
        self.began = began  # CLOCK_MONOTONIC when it began (s): to line it up with other clocks of this boot

    def as_dict(self) -> dict:
        keep = ("reused", "snapshot_point_s", "checkpoint_s", "image_bytes", "path", "cpu_shares")
        began = {} if self.began is None else {"monotonic_s": [round(self.began, 3), round(self.began + self.seconds, 3)]}
        return {"taken": self.taken, "detail": self.detail, "seconds": round(self.seconds, 3), **began,
                **{k: self.record[k] for k in keep if k in self.record}}


def _live_snapshot_off(address: str | None) -> bool:
    """Whether the live unit's edge-supervise runs with ``--snapshot off`` (its start record says so):
    then no start restores, and the snapshot would only cost the live runtime CPU."""
    try:
        with open(START_RECORD) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("snapshot") == "off" and (
        address is None or record.get("address") == address)


def _unit_nofile(unit: str) -> int | None:
    """The hard RLIMIT_NOFILE systemd gives ``unit`` (its LimitNOFILE=, as granted); None: unknown."""
    try:
        out = subprocess.run(["systemctl", "show", "-p", "LimitNOFILE", "--value", f"{unit}.service"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return int(out) if out.isdigit() else None


def _staged_record(stdout: str) -> dict | None:
    for line in reversed(stdout.splitlines()):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == "supervise.staged":
            return record
    return None


def _run(cmd: list[str]) -> tuple[dict | None, str]:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=STAGE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, f"edge-supervise --stage-snapshot ran over {STAGE_TIMEOUT_S:g} s"
    except OSError as exc:
        return None, f"edge-supervise --stage-snapshot did not run ({exc})"
    record = _staged_record(r.stdout)
    return record, (f"edge-supervise --stage-snapshot exited {r.returncode} without a result: "
                    f"{(r.stderr or r.stdout).strip()[-600:]}")


def stage_snapshot(layout: DeviceLayout, slot: str, unit: str, address: str | None = None) -> Staged:
    """The new bundle of ``slot`` checkpointed at its snapshot point, before the switch (see the
    module docstring); never raises for a snapshot that cannot be taken."""
    t0 = time.monotonic()
    if not layout.is_system_root:
        return Staged(False, f"--root {layout.root} is not this system's root: a snapshot holds the paths it was "
                             f"taken at, so the bundle's first start there takes one (edge-supervise)")
    if _live_snapshot_off(address):
        return Staged(False, f"{unit}.service runs edge-supervise with --snapshot off (its start record, "
                             f"{START_RECORD}): no start restores one")
    cmd = [sys.executable, "-m", "edge.supervise", "--stage-snapshot", "--bundle", str(layout.slot(slot) / SLOT_BUNDLE),
           "--id", f"{unit}-staging"]
    nofile = _unit_nofile(unit)
    if nofile:
        cmd += ["--nofile-limit", str(nofile)]
    record, why = _run(cmd)
    seconds = time.monotonic() - t0
    if record is None:
        return Staged(False, why, seconds, began=t0)
    if not record.get("taken"):
        return Staged(False, f"the snapshot could not be taken: {record.get('error', '?')}", seconds, record, t0)
    if record.get("reused"):
        return Staged(True, f"a valid snapshot was there already ({record.get('path')})", seconds, record, t0)
    return Staged(True, f"taken before the switch: boot to the snapshot point {record.get('snapshot_point_s', 0):.2f} s, "
                        f"checkpoint {record.get('checkpoint_s', 0):.2f} s, {record.get('image_bytes', 0) / 2**20:.0f} MiB",
                  seconds, record, t0)


def journal(message: str, warning: bool = False) -> None:
    """One line to the system log (the journal, where journald runs): what the install did about the
    snapshot, next to edge-supervise's own lines. Nothing where there is no log socket."""
    import syslog

    try:
        syslog.openlog("edge-bundle", 0, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_WARNING if warning else syslog.LOG_INFO, message)
        syslog.closelog()
    except OSError:
        pass
