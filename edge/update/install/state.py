"""The installer's state file, ``ROOT/var/lib/edge/install.json``: which slot is live, what each
slot holds, the trial of the last install, and a short history.

It is a record, not the truth: ``current`` says which slot is live and each slot's own
``edge-archive.json`` says what it holds. The installer writes the state after the disk has
changed, so a killed installer can leave it one step behind; :func:`edge.update.install.slots.recover`
brings it level on the next run.

The trial (:class:`Trial`) is the data of the update's health gate (edge/update/install/trial.py,
docs/update.md): ``install`` starts it (on trial, :data:`TRIAL_TRIES` tries); each start of the
unit while on trial takes a try, and the start that finds none left rolls back; the trial's
watcher commits it once ``edge selftest`` passes for the sustain window, or rolls back when a
check fails; ``mark-good`` / ``rollback`` end it by hand.
"""

from __future__ import annotations

import enum
from datetime import datetime, timezone
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edge.update.install.fsio import atomic_write
from edge.update.install.layout import DeviceLayout, SlotName

__all__ = ["STATE_FORMAT", "TRIAL_TRIES", "HISTORY_LIMIT", "SlotName", "TrialStatus", "SnapshotNote", "SlotRecord", "Trial",
           "HistoryEntry", "InstallState", "StateError", "load_state", "save_state", "now"]

STATE_FORMAT: Final = 1  # Final: the literal 1 to mypy, as InstallState.format wants
TRIAL_TRIES = 3  # starts an update gets to pass its trial; the start after the last one rolls it back
HISTORY_LIMIT = 50  # entries kept; the journal has the rest, and the file stays a few KiB

HistoryEvent = Literal["install", "snapshot", "commit", "rollback", "recover", "try"]


def now() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


class TrialStatus(str, enum.Enum):
    ON_TRIAL = "on_trial"  # the live slot was just installed and has not proven itself; tries count down
    COMMITTED = "committed"  # the live slot is good: the trial's watcher or mark-good committed it
    ROLLED_BACK = "rolled_back"  # the live slot is the one before an update that failed or was undone; see reason


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SnapshotNote(_Model):
    """The snapshot the install took of the slot's bundle before the switch (staging.py), or why none."""

    taken: bool  # the bundle had a restorable snapshot when current was switched to it
    detail: str  # how long it took, or why it could not be taken (no CRIU >= 4.1, the kernel, --snapshot off)
    at: datetime


class SlotRecord(_Model):
    """What a slot holds, copied from its signed manifest when it was filled."""

    bundle_sha256: str
    manifest_sha256: str  # sha256 of the slot's edge-archive.json: tells two packs of one bundle apart
    key_id: str  # the key that signed it
    edge_version: str
    engine: str
    package: str | None = None  # the model package's name
    archive: str  # the file it was installed from (its name; "" when rebuilt from the slot)
    installed: datetime
    unpacked_bytes: int = Field(ge=0)  # bytes
    snapshot: SnapshotNote | None = None  # None: not tried (--no-snapshot, a state rebuilt from the slots, older installers)


class Trial(_Model):
    status: TrialStatus
    slot: SlotName  # the slot the status is about: the live one
    tries: int = Field(ge=0)  # granted when the trial started
    tries_left: int = Field(ge=0)  # each start of the unit on trial takes one
    since: datetime  # when the status was set
    reason: str | None = None  # rolled_back: why ("manual", a failed self-test, tries used up, ...)


class HistoryEntry(_Model):
    at: datetime
    event: HistoryEvent
    slot: SlotName | None = None
    bundle_sha256: str | None = None
    detail: str = ""


class InstallState(_Model):
    format: Literal[1] = STATE_FORMAT
    live: SlotName | None = None  # the slot `current` points at, as last recorded
    previous: SlotName | None = None  # where rollback goes: the slot live before the last install; None after one
    slots: dict[SlotName, SlotRecord] = {}
    trial: Trial | None = None  # None: nothing installed yet
    history: list[HistoryEntry] = []

    def add(self, event: HistoryEvent, slot: SlotName | None, detail: str = "") -> None:
        record = self.slots.get(slot) if slot else None
        self.history.append(HistoryEntry(at=now(), event=event, slot=slot,
                                         bundle_sha256=record.bundle_sha256 if record else None, detail=detail))
        del self.history[:-HISTORY_LIMIT]


class StateError(RuntimeError):
    """The state file exists but is not a state this installer wrote (pydantic's message says where)."""


def load_state(layout: DeviceLayout) -> InstallState | None:
    """The recorded state; None when there is no state file (nothing was ever installed)."""
    try:
        data = layout.state_file.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return InstallState.model_validate_json(data)
    except ValidationError as exc:
        raise StateError(f"{layout.state_file} is not a valid state: {exc}") from None


def save_state(layout: DeviceLayout, state: InstallState) -> None:
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(layout.state_file, (state.model_dump_json(indent=2) + "\n").encode())
