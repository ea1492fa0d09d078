"""The slots as they are on disk, and bringing the state level with them after a killed run.

A slot directory only ever appears by the rename of a staging directory that was unpacked,
verified and fsynced completely, so ``slots/X`` existing means a complete slot, and
``slots/X.staging`` or ``slots/X.old`` existing means a run that was cut short (SIGKILL, power).
:func:`recover` removes those, then :func:`reconcile` makes the state agree with ``current``
and with each slot's own manifest.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

from edge.update.install.archive import MANIFEST_NAME, FileEntry, SymlinkEntry, parse_manifest
from edge.update.install.layout import SLOT_MANIFEST, SLOTS, DeviceLayout, SlotName, other_slot
from edge.update.install.state import (TRIAL_TRIES, InstallState, SlotRecord, StateError, Trial, TrialStatus, load_state,
                                now, save_state)

__all__ = ["slot_manifest", "record_from_slot", "check_slot", "clean_leftovers", "reconcile", "recover",
           "undo_unfinished_switch",
           "install_target"]


def slot_manifest(layout: DeviceLayout, name: str):
    """``(manifest, its bytes)`` of slot ``name``; None when the slot does not exist. A slot whose
    manifest does not parse raises ValueError (pydantic's ValidationError is one)."""
    try:
        data = (layout.slot(name) / SLOT_MANIFEST).read_bytes()
    except FileNotFoundError:
        return None
    return parse_manifest(data), data


def record_from_slot(layout: DeviceLayout, name: str, archive: str = "") -> SlotRecord | None:
    try:
        found = slot_manifest(layout, name)
    except ValueError:
        return None
    if found is None:
        return None
    m, data = found
    return SlotRecord(bundle_sha256=m.bundle_sha256, manifest_sha256=hashlib.sha256(data).hexdigest(),
                      key_id=m.key_id, edge_version=m.edge_version, engine=m.engine, package=m.package.name,
                      archive=archive, installed=now(), unpacked_bytes=m.unpacked_bytes)


def check_slot(layout: DeviceLayout, name: str, full: bool = False) -> list[str]:
    """What is wrong with slot ``name`` against its own manifest: a missing entry, another type or
    size, another symlink target, and with ``full`` another sha256 (reads every byte). []: complete."""
    try:
        found = slot_manifest(layout, name)
    except ValueError as exc:
        return [f"slot {name}: its {MANIFEST_NAME} does not parse ({str(exc).splitlines()[0]})"]
    if found is None:
        return [f"slot {name}: no {layout.slot(name)}/{SLOT_MANIFEST}"]
    problems = []
    base = layout.slot(name)
    for e in found[0].files:
        path = base / e.path
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            problems.append(f"slot {name}: missing {e.path}")
            continue
        kind = {stat.S_IFREG: "file", stat.S_IFDIR: "dir", stat.S_IFLNK: "symlink"}.get(stat.S_IFMT(st.st_mode))
        if kind != e.type:
            problems.append(f"slot {name}: {e.path} is a {kind or 'special file'}, the manifest says {e.type}")
        elif isinstance(e, FileEntry) and st.st_size != e.size:
            problems.append(f"slot {name}: {e.path} is {st.st_size} bytes, the manifest says {e.size}")
        elif isinstance(e, SymlinkEntry) and os.readlink(path) != e.target:
            problems.append(f"slot {name}: {e.path} -> {os.readlink(path)}, the manifest says {e.target}")
        elif full and isinstance(e, FileEntry) and _sha256(path) != e.sha256:
            problems.append(f"slot {name}: {e.path} does not have the manifest's sha256")
    return problems


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def clean_leftovers(layout: DeviceLayout) -> list[str]:
    """Remove what a killed run left (never a slot or ``current``); the paths removed."""
    removed = []
    for path in layout.leftovers():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        removed.append(str(path))
    if removed and layout.slots_dir.is_dir():
        from edge.update.install.fsio import fsync_dir

        fsync_dir(layout.slots_dir)
    return removed


def install_target(layout: DeviceLayout, state: InstallState | None, live: str | None) -> SlotName:
    """The slot an install fills: never the live one; with no ``current``, never the last live one."""
    if live is not None:
        return other_slot(live)
    if state is not None and state.live is not None:
        return other_slot(state.live)
    return SLOTS[0]


def reconcile(layout: DeviceLayout, state: InstallState | None) -> tuple[InstallState, list[str]]:
    """``state`` made to agree with the disk, and a note for each change (also in its history).
    Reads only; the caller saves."""
    st = state.model_copy(deep=True) if state is not None else InstallState()
    notes: list[tuple[SlotName | None, str]] = []
    changed = set()
    for name in SLOTS:
        disk = record_from_slot(layout, name)
        rec = st.slots.get(name)
        if disk is None:
            if rec is not None:
                del st.slots[name]
                changed.add(name)
                notes.append((name, f"slot {name} is gone or unreadable; its record was dropped"))
        elif rec is None or rec.manifest_sha256 != disk.manifest_sha256:
            st.slots[name] = disk
            changed.add(name)
            notes.append((name, f"slot {name} holds bundle {disk.bundle_sha256[:12]}, which the state did not "
                                f"record (an install stopped before recording it)"))
    live, why = layout.live_slot()
    if live is not None and (live != st.live or live in changed):
        before = st.live
        st.previous = before if before in st.slots and before != live and before not in changed else None
        st.trial = Trial(status=TrialStatus.ON_TRIAL, slot=live, tries=TRIAL_TRIES, tries_left=TRIAL_TRIES,
                         since=now())
        st.live = live
        notes.append((live, f"current points at slot {live}, the state said {before or 'nothing'}: an install "
                            f"stopped after switching; slot {live} is on trial from now"))
    if st.previous is not None and (st.previous == st.live or st.previous not in st.slots or st.previous in changed):
        st.previous = None
    for slot, note in notes:
        st.add("recover", slot, note)
    return st, [n for _, n in notes]


def undo_unfinished_switch(layout: DeviceLayout, state: InstallState | None) -> tuple[InstallState | None, list[str]]:
    """An install killed (SIGKILL, power cut) between switching ``current`` and recording the
    install left ``current`` on a slot the state does not call live. The install did not finish,
    so it is undone: ``current`` goes back to the recorded live slot, when that slot is still
    complete and holds what the state says, and the trial says why. Otherwise (a first install,
    the old slot gone) :func:`reconcile` puts the new slot on trial instead."""
    live, why = layout.live_slot()
    if state is None or why or live is None or state.live is None or live == state.live:
        return state, []
    was = state.live
    rec, disk = state.slots.get(was), record_from_slot(layout, was)
    if rec is None or disk is None or disk.manifest_sha256 != rec.manifest_sha256 or check_slot(layout, was):
        return state, []
    from edge.update.install.fsio import switch_symlink

    switch_symlink(layout.current, layout.current_target(was))
    reason = (f"the installer stopped after switching to slot {live} and before recording the install "
              f"(killed, or a power cut): the install did not finish, so slot {was} is live again")
    st = state.model_copy(deep=True)
    st.trial = Trial(status=TrialStatus.ROLLED_BACK, slot=was, tries=0, tries_left=0, since=now(), reason=reason)
    st.add("rollback", was, reason)
    save_state(layout, st)
    return st, [reason]


def recover(layout: DeviceLayout) -> tuple[InstallState, list[str]]:
    """With the lock held: remove leftovers, read the state (a corrupt one is kept aside and
    rebuilt from the slots), reconcile it with the disk and save it when it changed."""
    notes = [f"removed {p} (left by a run that was cut short)" for p in clean_leftovers(layout)]
    try:
        state = load_state(layout)
    except StateError as exc:
        aside = layout.state_file.with_name(f"{layout.state_file.name}.corrupt-{now():%Y%m%dT%H%M%S}")
        os.rename(layout.state_file, aside)
        notes.append(f"{exc}; kept as {aside.name}, rebuilt from the slots")
        state = None
    state, undone = undo_unfinished_switch(layout, state)
    notes += undone
    fixed, changes = reconcile(layout, state)
    notes += changes
    if state is None and fixed.live is None and not fixed.slots:
        return fixed, notes  # nothing installed: no state file to write
    if state is None or changes:
        save_state(layout, fixed)
    return fixed, notes
