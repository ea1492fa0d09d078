"""``edge-bundle status``: the live slot, the other one, the trial, the history; and a health
word with its exit status (:data:`HEALTH`).

Status takes the installer's lock when it is free and runs ``recover`` (a killed install's
staging directory is removed, the state brought level). While another installer holds the
lock it changes nothing and says so.
"""

from __future__ import annotations

import json

from edge.update.install.fsio import Busy, DirLock
from edge.update.install.layout import SLOTS, DeviceLayout, other_slot
from edge.update.install.slots import check_slot, reconcile, recover
from edge.update.install.state import InstallState, StateError, TrialStatus, load_state

__all__ = ["HEALTH", "status", "render_text", "render_json"]

HEALTH = {  # word -> exit status of `edge-bundle status`
    "committed": 0,  # the live slot is committed (the trial's watcher, or mark-good)
    "on_trial": 1,  # the live slot was just installed and is not committed yet
    "rolled_back": 2,  # an update was rolled back: the live slot is the one before it
    "broken": 2,  # nothing installed, current missing or not ours, the live slot incomplete, state unreadable
}


def _read(layout: DeviceLayout) -> tuple[InstallState | None, list[str], list[str]]:
    """The state, the notes of what was fixed, the problems that stop it being read."""
    if not layout.state_dir.is_dir():
        return None, [], []
    lock = DirLock(layout.state_dir)
    try:
        lock.acquire()
    except Busy:
        try:
            state, _ = reconcile(layout, load_state(layout))  # in memory only: the other run owns the disk
        except StateError as exc:
            return None, ["an install, rollback or mark-good is running: nothing was changed"], [str(exc)]
        return state, ["an install, rollback or mark-good is running: nothing was changed"], []
    try:
        state, notes = recover(layout)
        return state, notes, []
    finally:
        lock.release()


def status(layout: DeviceLayout) -> dict:
    state, notes, problems = _read(layout)
    live, why = layout.live_slot()
    if why:
        problems.append(why)
    elif live is None:
        problems.append(f"nothing is installed: no {layout.current}")
    else:
        problems += check_slot(layout, live)[:5]
    trial = state.trial if state else None
    if problems:
        health = "broken"
    elif trial is None or trial.slot != live:
        health = "on_trial"  # a live slot with no trial of its own is unproven
    else:
        health = {TrialStatus.COMMITTED: "committed", TrialStatus.ON_TRIAL: "on_trial",
                  TrialStatus.ROLLED_BACK: "rolled_back"}[trial.status]
    slots = {}
    for name in SLOTS:
        rec = state.slots.get(name) if state else None
        slots[name] = None if rec is None else rec.model_dump(mode="json")
    other = other_slot(live) if live else None
    return {
        "health": health,
        "exit_code": HEALTH[health],
        "root": str(layout.root),
        "live": live,
        "other": other,
        "previous": state.previous if state else None,
        "slots": slots,
        "trial": trial.model_dump(mode="json") if trial else None,
        "history": [h.model_dump(mode="json") for h in state.history] if state else [],
        "problems": problems,
        "notes": notes,
    }


def _slot_line(report: dict, name: str | None) -> str:
    if name is None:
        return "none"
    rec = report["slots"].get(name)
    if rec is None:
        return f"slot {name}: empty"
    snap = rec.get("snapshot")
    said = "" if snap is None else (f"; snapshot {snap['detail']}" if snap["taken"] else
                                    f"; no snapshot before the switch (first start fresh): {snap['detail']}")
    return (f"slot {name}: bundle {rec['bundle_sha256'][:12]} (edge {rec['edge_version']}, {rec['engine']}, "
            f"{rec['package'] or 'package ?'}, {rec['unpacked_bytes'] / (1 << 20):.1f} MiB), "
            f"installed {rec['installed']}" + (f" from {rec['archive']}" if rec["archive"] else "") + said)


def render_text(report: dict, history: int = 10) -> str:
    lines = [f"health: {report['health']} (exit {report['exit_code']})"]
    lines.append(f"live:   {_slot_line(report, report['live'])}")
    other = report["other"]
    tag = " (rollback goes here)" if other is not None and report["previous"] == other else ""
    lines.append(f"other:  {_slot_line(report, other)}{tag}")
    t = report["trial"]
    if t is None:
        lines.append("trial:  none")
    elif t["status"] == "on_trial":
        lines.append(f"trial:  slot {t['slot']} on trial since {t['since']}, {t['tries_left']} of {t['tries']} "
                     f"tries left; `edge-bundle mark-good` commits it, `edge-bundle rollback` undoes it")
    elif t["status"] == "committed":
        lines.append(f"trial:  slot {t['slot']} committed {t['since']}")
    else:
        lines.append(f"trial:  rolled back to slot {t['slot']} {t['since']}: {t['reason']}")
    lines += [f"problem: {p}" for p in report["problems"]]
    lines += [f"note:   {n}" for n in report["notes"]]
    if report["history"]:
        lines.append("history:")
        for h in report["history"][-history:]:
            lines.append(f"  {h['at']}  {h['event']:<8} {('slot ' + h['slot']) if h['slot'] else '':<7} "
                         f"{(h['bundle_sha256'] or '')[:12]:<12}  {h['detail']}")
    return "\n".join(lines)


def render_json(report: dict) -> str:
    return json.dumps(report, indent=2)
