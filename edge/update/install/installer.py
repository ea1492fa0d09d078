"""The installer's commands, each a sequence of stages: ``install``, ``rollback``, ``mark_good``.

install (docs/archive.md, "On the device"):

1. ``read_head``: the signature of the manifest against the trusted keys, then the manifest;
2. ``check_device``: compatibility (arch, L4T, device tree), then free space;
3. ``check_host`` (host_paths.py): the host directories, socket, user and unit drop-in the bundle
   names, read from the archive in a pass of their own, against the installer's allow-list
   (Refused("host")), then resolved under the root (NotReady: a symlink out of the root, a
   directory the start would refuse);
   -- nothing has been written up to here; a refusal leaves the root byte-identical --
4. ``recover``: under the lock, remove what a killed run left and bring the state level;
5. ``unpack``: into the inactive slot's staging directory, each member checked as it streams;
   then fs-verity enabled on the package's files where the device has it (fsverity.py: the
   runtime then checks the kernel's digest instead of hashing them at each boot);
6. ``replace_slot``: the staging directory renamed into the slot (the old content moved aside
   first, then removed: ``rename(2)`` cannot replace a non-empty directory); then the caches
   (snapshots) of bundles no slot holds any more are removed (cache.py);
   -- the old runtime serves on up to the switch --
7. ``stage_snapshot`` (staging.py): the new bundle booted to its snapshot point in a staging
   container and checkpointed into its cache, so that its first start restores; one that cannot
   be taken is noted, and the install goes on (skipped with ``--no-snapshot``, and for a root
   other than ``/``: a snapshot holds the paths it was taken at);
8. ``switch``: ``current`` renamed over by a new symlink to the slot;
9. ``record``: the slot on trial in the state file, with what became of its snapshot;
10. ``restart``: the new bundle's host directories made ready (edge/system/socket_dir.py, as
   edge-supervise does at each start: a root ``edge serve``'s leftovers removed), resolved and
   checked again as ``check_host`` does; then ``systemctl daemon-reload`` (the unit's drop-in
   follows ``current``) and ``systemctl reload edge`` (the new bundle restored beside the old
   runtime, :func:`reload_unit`), or ``systemctl restart edge`` where that fails; skipped with
   ``--no-restart`` or a root other than ``/``.

Should preparing the directories fail after the switch, the install stands with a warning:
edge-supervise prepares them again, or refuses them, at the start.

``crash_at`` names a point after a stage (``edge.update.install.cli.CRASH_POINTS``) where the installer SIGKILLs
itself, for the tests of a killed installer: whatever it left, the next run or ``status``
finds ``current`` pointing at a complete slot.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from edge.update.install import archive as fmt
from edge.update.install.cache import prune_caches
from edge.update.install.compat import check_compatible, check_space, device_facts
from edge.update.install.errors import InstallError, NotReady, Refused, RestartFailed
from edge.update.install.fsio import DirLock, Busy, atomic_write, fsync_dir, switch_symlink
from edge.update.install.fsverity import enable_package_verity
from edge.update.install.host_paths import MAX_META_BYTES, META, HostDirs, check_host, check_meta, host_dirs
from edge.update.install.layout import SLOT_BUNDLE, DeviceLayout, SlotName, try_token
from edge.update.install.slots import check_slot, install_target, recover
from edge.update.install.staging import Staged, journal, stage_snapshot
from edge.update.install.state import (TRIAL_TRIES, InstallState, SlotRecord, SnapshotNote, Trial, TrialStatus, now,
                                       save_state)
from edge.update.install.unpack import UnpackStats, unpack
from edge.system.socket_dir import SocketDirError, prepare_host_dirs, prepare_socket_dir

__all__ = ["UNIT", "InstallReport", "install", "rollback", "switch_back", "on_trial", "mark_good", "locked",
           "restart_unit"]

UNIT = "edge"
RESTART_TIMEOUT_S = 150.0  # above the unit's TimeoutStartSec (120 s): systemctl waits for READY
LOCK_WAIT_S = 5.0  # a command waits this long for the lock: a `status` holds it for milliseconds
HOOK_LOCK_WAIT_S = 60.0  # the trial's hooks (edge-trial) wait longer: they act for no one who could retry


class InstallReport:
    def __init__(self, slot: str, previous: str | None, manifest, stats: UnpackStats, timings: dict[str, float],
                 restart: str, notes: list[str], staged: Staged | None = None) -> None:
        self.slot = slot
        self.previous = previous
        self.manifest = manifest
        self.stats = stats
        self.timings = timings  # stage -> seconds
        self.restart = restart  # what happened to the unit, in words
        self.notes = notes  # what recover found and fixed
        self.staged = staged  # the snapshot before the switch; None: not tried (--no-snapshot)


def _crash(crash_at: str | None, point: str) -> None:
    if crash_at == point:
        os.kill(os.getpid(), signal.SIGKILL)


class locked:
    """The installer's lock (the state directory), with ``recover`` run under it."""

    def __init__(self, layout: DeviceLayout, create: bool, wait_s: float = LOCK_WAIT_S) -> None:
        self.layout = layout
        self.wait_s = wait_s
        if create:
            layout.state_dir.mkdir(parents=True, exist_ok=True)
        elif not layout.state_dir.is_dir() and not os.path.lexists(layout.current):
            raise NotReady(f"nothing is installed under {layout.root} (no {layout.state_dir}, no {layout.current})")
        self._lock = DirLock(layout.state_dir)

    def __enter__(self) -> tuple[InstallState, list[str]]:
        self.layout.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire(self.wait_s)
        except Busy as exc:
            raise NotReady(str(exc)) from None
        try:
            return recover(self.layout)
        except BaseException:
            self._lock.release()
            raise

    def __exit__(self, *exc) -> None:
        self._lock.release()


# ------------------------------------------------------------------ install


def read_head(reader, layout: DeviceLayout):
    """The signature (against the trusted keys), then the manifest: ``(manifest, its bytes, signature)``."""
    trusted = fmt.load_trusted_keys(layout.keys_dir)
    with fmt.refusals():
        manifest_bytes, signature = reader.head()
    signer = fmt.verify_signature(manifest_bytes, signature, trusted)
    with fmt.refusals():
        manifest = fmt.parse_manifest(manifest_bytes)  # pydantic's message names the field
        fmt.check_key_id(manifest, signer)
    return manifest, manifest_bytes, signature


def check_device(layout: DeviceLayout, manifest, assume_free: int | None) -> None:
    check_compatible(manifest, device_facts(layout))
    check_space(layout, manifest.unpacked_bytes, assume_free)


def replace_slot(layout: DeviceLayout, staging: Path, slot: str) -> None:
    target, old = layout.slot(slot), layout.old(slot)
    if os.path.lexists(target):
        os.rename(target, old)  # a kill here leaves no slots/X and a slots/X.old: X is not live, recover removes it
    os.rename(staging, target)
    fsync_dir(layout.slots_dir)
    if os.path.lexists(old):
        shutil.rmtree(old)


def switch(layout: DeviceLayout, slot: str) -> None:
    layout.bundle_dir.mkdir(parents=True, exist_ok=True)
    switch_symlink(layout.current, layout.current_target(slot))


def record(layout: DeviceLayout, state: InstallState, slot: SlotName, archive: Path, manifest, manifest_bytes: bytes,
           live: SlotName | None, staged: Staged | None = None, *, takes_try: bool = False) -> InstallState:
    """The new slot, live and on trial. ``takes_try``: the install restarts the unit next, so it
    takes that start's try here (loaded already) and leaves the token that tells the start's
    pre-start so (``edge-trial``); the state is saved first, so a crash between the two costs a
    try, never grants one."""
    st = state.model_copy(deep=True)
    note = None if staged is None else SnapshotNote(taken=staged.taken, detail=staged.detail, at=now())
    st.slots[slot] = SlotRecord(bundle_sha256=manifest.bundle_sha256,
                                manifest_sha256=hashlib.sha256(manifest_bytes).hexdigest(), key_id=manifest.key_id,
                                edge_version=manifest.edge_version, engine=manifest.engine,
                                package=manifest.package.name, archive=archive.name, installed=now(),
                                unpacked_bytes=manifest.unpacked_bytes, snapshot=note)
    st.previous = live
    st.live = slot
    st.trial = Trial(status=TrialStatus.ON_TRIAL, slot=slot, tries=TRIAL_TRIES, tries_left=TRIAL_TRIES, since=now())
    st.add("install", slot, f"from {archive.name}; previous: {f'slot {live}' if live else 'none'}")
    if staged is not None:
        st.add("snapshot", slot, staged.detail if staged.taken else
               f"none before the switch, so its first start is fresh: {staged.detail}")
    layout.try_taken_file.unlink(missing_ok=True)
    if takes_try:
        st.trial.tries_left -= 1
        st.add("try", slot, f"start 1 of {TRIAL_TRIES} on trial: the install's restart")
    save_state(layout, st)
    if takes_try:
        atomic_write(layout.try_taken_file, try_token(st.model_dump(mode="json")["trial"]))
    return st


def _live_host_dirs(layout: DeviceLayout) -> HostDirs | None:
    """The live bundle's host directories, checked as install checked them (host_paths.py):
    a slot rolled back to is prepared by the same rules. None for a bundle without edge-bundle.json."""
    try:
        fd = os.open(layout.current / META, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_META_BYTES + 1)
    if len(data) > MAX_META_BYTES:
        raise Refused("host", f"{META}: more than {MAX_META_BYTES} bytes")
    return host_dirs(layout, check_meta(data))


def prepare_sockets(layout: DeviceLayout) -> str | None:
    """The live bundle's socket directory (and its state and metrics directories) made ready for
    its start; what was done, or a warning, for the operator (None when nothing was to do)."""
    try:
        found = _live_host_dirs(layout)
        if found is None or found.socket_dir is None and found.state_dir is None and found.metrics_dir is None:
            return None
        done = None
        if found.socket_dir is not None:
            done = prepare_socket_dir(found.socket_dir, found.uid, found.gid, socket_name=found.socket_name)
        prepare_host_dirs(found.uid, found.gid, found.metrics_dir, found.state_dir)
    except (InstallError, SocketDirError, OSError, ValueError) as exc:
        return (f"warning: the bundle's host directories were not prepared: {exc}; edge-supervise prepares (or "
                f"refuses) them at start")
    if done is None:
        return None
    path = found.socket_dir
    changed = ["created"] if done["created"] else []
    if done["chowned_from"]:
        changed.append(f"owner was {done['chowned_from']}, now {found.uid}:{found.gid}")
    if done["chmodded_from"]:
        changed.append(f"mode was {done['chmodded_from']}, now 0750")
    if done["removed"]:
        changed.append(f"removed an earlier run's {', '.join(done['removed'])}")
    return f"socket directory {path}: {'; '.join(changed)}" if changed else None


def restarts(layout: DeviceLayout, wanted: bool) -> bool:
    """Whether :func:`restart_unit` restarts the unit: asked to, on this system's root."""
    return wanted and layout.is_system_root


def _systemctl(*args: str) -> subprocess.CompletedProcess:
    """``systemctl ARGS``, its output captured; RestartFailed when it did not run."""
    try:
        return subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=RESTART_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RestartFailed(f"`systemctl {' '.join(args)}` did not run ({exc})") from None


def restart_unit(layout: DeviceLayout, wanted: bool, *, block: bool = True, reset_failed: bool = False,
                 unit: str = UNIT, daemon_reload: bool = True) -> str:
    """``systemctl restart edge``. ``block=False`` only queues it: the trial's watcher is stopped
    with the unit it restarts (BindsTo=), so it must not wait for it. ``reset_failed`` first
    clears a unit that failed (its start limit hit), which systemd would not start again.
    ``daemon_reload=False``: the caller ran ``systemctl daemon-reload`` already."""
    if not restarts(layout, wanted):
        return ("restart skipped (--no-restart)" if not wanted else
                f"restart skipped (--root {layout.root} is not this system's root)")
    cmds = [["daemon-reload"]] if daemon_reload else []
    if reset_failed:
        cmds.append(["reset-failed", f"{unit}.service"])
    cmds.append(["restart", *([] if block else ["--no-block"]), f"{unit}.service"])
    for cmd in cmds:
        r = _systemctl(*cmd)
        if r.returncode != 0 and cmd[0] != "reset-failed":  # reset-failed fails on a unit that has not failed
            raise RestartFailed(f"`systemctl {' '.join(cmd)}` failed ({r.returncode}): {r.stderr.strip()[-400:]}")
    return f"restarted {unit}.service" if block else f"restart of {unit}.service queued"


def reload_unit(layout: DeviceLayout, wanted: bool, *, unit: str = UNIT) -> str:
    """After the switch: ``systemctl reload edge``, which restores the new bundle beside the old
    runtime and switches the socket to it once ready (edge/supervise/handover.py): the stop is off
    the outage. The try the install took is that start's, so its token goes (no pre-start runs),
    and the trial's watcher is (re)started: a reload starts no unit. Where the reload fails (the
    unit is not running, no snapshot, too little memory for two, a unit without ExecReload=), the
    old runtime serves on and :func:`restart_unit` restarts the unit instead: stop, then restore."""
    if not restarts(layout, wanted):
        return restart_unit(layout, wanted, unit=unit)
    r = _systemctl("daemon-reload")  # the unit's drop-in follows current
    if r.returncode != 0:
        raise RestartFailed(f"`systemctl daemon-reload` failed ({r.returncode}): {r.stderr.strip()[-400:]}")
    reloaded = _systemctl("reload", f"{unit}.service")
    if reloaded.returncode == 0:
        layout.try_taken_file.unlink(missing_ok=True)
        trial = _systemctl("restart", "--no-block", f"{unit}-trial.service")
        note = "" if trial.returncode == 0 else \
            f"; warning: {unit}-trial.service was not started: {trial.stderr.strip()[-200:]}"
        return f"reloaded {unit}.service: the new bundle restored beside the old runtime, then that one stopped{note}"
    why = (reloaded.stderr or reloaded.stdout).strip()[-300:] or "it failed"
    return f"{restart_unit(layout, wanted, unit=unit, reset_failed=True, daemon_reload=False)} (no reload: {why})"


def install(archive: Path, layout: DeviceLayout, *, restart: bool = True, crash_at: str | None = None,
            assume_free: int | None = None, unit: str = UNIT, snapshot: bool = True) -> InstallReport:
    timings: dict[str, float] = {}
    t = time.monotonic()
    with fmt.open_archive(archive) as reader:
        manifest, manifest_bytes, signature = read_head(reader, layout)
        check_device(layout, manifest, assume_free)
        check_host(layout, archive, manifest, manifest_bytes, signature)  # the bundle's host paths, user, drop-in
        timings["verify"] = time.monotonic() - t
        _crash(crash_at, "after-verify")
        with locked(layout, create=True) as (state, notes):
            live, why = layout.live_slot()
            if why:
                raise NotReady(f"{why}; move it aside (the first install makes the link)")
            slot = install_target(layout, state, live)
            staging = layout.staging(slot)
            layout.slots_dir.mkdir(parents=True, exist_ok=True)
            t = time.monotonic()
            try:
                stats = unpack(reader, manifest, manifest_bytes, signature, staging,
                               midway=lambda: _crash(crash_at, "mid-unpack"))
                timings["unpack"] = time.monotonic() - t
                t = time.monotonic()
                notes += enable_package_verity(staging / SLOT_BUNDLE)
                timings["fsverity"] = time.monotonic() - t
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            _crash(crash_at, "after-unpack")
            t = time.monotonic()
            replace_slot(layout, staging, slot)
            _crash(crash_at, "after-rename")
            notes += [f"removed {p}: the cache of a bundle no slot holds" for p in prune_caches(layout)]
            timings["switch"] = time.monotonic() - t
            staged = None
            # The old runtime still serves: the new one is checkpointed beside it. Not for another root
            # (a rootfs for flashing, a test's): a snapshot holds the paths it was taken at.
            if snapshot and layout.is_system_root:
                t = time.monotonic()
                staged = stage_snapshot(layout, slot, unit)
                timings["snapshot"] = time.monotonic() - t
                journal(f"install of {archive.name} into slot {slot}: snapshot "
                        + (staged.detail if staged.taken else f"not taken, the first start is fresh: {staged.detail}"),
                        warning=not staged.taken)
            t = time.monotonic()
            switch(layout, slot)
            _crash(crash_at, "after-switch")
            record(layout, state, slot, archive, manifest, manifest_bytes, live, staged,
                   takes_try=restarts(layout, restart))
            timings["switch"] += time.monotonic() - t
            _crash(crash_at, "after-state")
    t = time.monotonic()
    notes += [n for n in (prepare_sockets(layout),) if n]
    # reset-failed: the update's starts get the unit's whole start limit (StartLimitBurst=), not
    # what earlier restarts left of it; the trial's tries (3) end a crash loop before it is spent.
    restarted = reload_unit(layout, restart, unit=unit)
    timings["restart"] = time.monotonic() - t
    return InstallReport(slot, live, manifest, stats, timings, restarted, notes, staged)


# ------------------------------------------------------------------ rollback, mark-good


def switch_back(layout: DeviceLayout, state: InstallState, live: str, reason: str) -> InstallState:
    """With the lock held: ``current`` back to ``state.previous``, the trial rolled back with
    ``reason``; the new state, saved. NotReady when there is no complete slot to go back to."""
    target = state.previous
    if target is None:
        other = state.trial.reason if state.trial and state.trial.status == TrialStatus.ROLLED_BACK else None
        raise NotReady("nothing to roll back to: " + (
            f"slot {live} was rolled back to already ({other}); install a bundle" if other else
            f"slot {live} is the only bundle installed"))
    problems = check_slot(layout, target)
    if problems:
        raise NotReady(f"slot {target} is not complete, so current stays on slot {live}: {problems[0]}")
    switch_symlink(layout.current, layout.current_target(target))
    st = state.model_copy(deep=True)
    st.live, st.previous = target, None  # the slot left holds the bundle rolled back from
    st.trial = Trial(status=TrialStatus.ROLLED_BACK, slot=target, tries=0, tries_left=0, since=now(), reason=reason)
    st.add("rollback", target, f"from slot {live}: {reason}")
    save_state(layout, st)
    return st


def rollback(layout: DeviceLayout, *, reason: str = "manual", restart: bool = True, block: bool = True,
             reset_failed: bool = False, only_on_trial: bool = False, unit: str = UNIT,
             wait_s: float = LOCK_WAIT_S) -> tuple[str, str, str]:
    """Switch ``current`` back to the previous slot; ``(from slot, to slot, what the unit did)``.
    ``only_on_trial``: the automatic rollbacks (docs/update.md) undo an update on trial, never a
    committed one (NotReady then)."""
    with locked(layout, create=False, wait_s=wait_s) as (state, _notes):
        live, why = layout.live_slot()
        if why:
            raise NotReady(why)
        if live is None:
            raise NotReady("nothing to roll back to: nothing is installed")
        if only_on_trial and not on_trial(state, live):
            raise NotReady(f"slot {live} is not on trial ({state.trial.status.value if state.trial else 'no trial'}): "
                           f"an automatic rollback undoes updates on trial only")
        st = switch_back(layout, state, live, reason)
    assert st.live is not None  # switch_back made state.previous the live slot
    prepared = prepare_sockets(layout)  # a rollback goes on whatever it says: a warning is told
    restarted = restart_unit(layout, restart, block=block, reset_failed=reset_failed, unit=unit)
    return live, st.live, restarted + (f" ({prepared})" if prepared and prepared.startswith("warning") else "")


def on_trial(state: InstallState, live: str | None) -> bool:
    t = state.trial
    return t is not None and t.status == TrialStatus.ON_TRIAL and t.slot == live


def mark_good(layout: DeviceLayout, *, trial_of: str | None = None, wait_s: float = LOCK_WAIT_S) -> tuple[str, str]:
    """Commit the live slot: ends a trial, or acknowledges a rollback. ``(slot, what changed)``.
    ``trial_of``: commit only while slot ``trial_of`` is live and on trial (the trial's watcher:
    a rollback or another install may have come in between); NotReady otherwise."""
    with locked(layout, create=False, wait_s=wait_s) as (state, _notes):
        live, why = layout.live_slot()
        if why or live is None:
            raise NotReady(why or "nothing is installed: no current")
        trial = state.trial
        if trial_of is not None and (live != trial_of or not on_trial(state, live)):
            raise NotReady(f"slot {trial_of} is no longer the live slot on trial; nothing was committed")
        if trial is not None and trial.status == TrialStatus.COMMITTED and trial.slot == live:
            return live, "already committed"
        was = "a rollback acknowledged" if trial and trial.status == TrialStatus.ROLLED_BACK else "trial committed"
        st = state.model_copy(deep=True)
        st.trial = Trial(status=TrialStatus.COMMITTED, slot=live, tries=trial.tries if trial else 0,
                         tries_left=trial.tries_left if trial else 0, since=now())
        st.add("commit", live, f"{'trial: self-test passed for the sustain window' if trial_of else 'mark-good'}: {was}")
        save_state(layout, st)
    return live, was
