"""``edge-trial``: the update's trial, run by systemd around edge.service (docs/update.md).

An install leaves the new slot on trial with :data:`~edge.update.install.state.TRIAL_TRIES` tries.
Three hooks end the trial, each a subcommand:

    pre-start   edge.service ExecStartPre=: each start on trial takes a try; the start that
                finds none left rolls back first, so it starts the previous bundle. This is
                what ends reboots before the commit, and restarts spread out in time (a hang
                the watchdog restarts now and then). Also where a killed installer's
                unfinished switch is undone (slots.recover).
    watch       edge-trial.service, started with edge.service once it is READY: ``edge
                selftest``'s checks, again and again; all passing for the sustain window commits
                the trial (mark-good), a failing check rolls back and restarts the unit.
    on-failure  edge-trial-failed.service, edge.service's OnFailure=: the unit failed on trial:
                roll back, clear the failure, start it again. This is what ends a crash loop:
                systemd 252 counts an automatic restart twice against StartLimitBurst=5 (when
                it schedules it and when it starts it), so the unit fails after three starts.

None of them touches a committed slot. ``pre-start`` runs at every boot, so its common case
(nothing on trial) reads the state with :mod:`json` and :mod:`edge.update.install.layout` only: about
30 ms, without pydantic's 150 ms (DEVELOPERS.md); everything else loads when there is work.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from edge.config.argtypes import number
from edge.update.install.layout import PACKAGE_IN_BUNDLE, SLOTS, DeviceLayout, try_token

__all__ = ["EXIT", "needs_attention", "trial_slot", "pre_start", "watch", "on_failure", "main"]

EXIT = {"done": 0, "rolled_back": 1, "usage": 2, "failed": 3}  # `edge-trial` exit statuses
SUSTAIN_S = 60.0  # the self-test passes for this long before the trial commits (s)
INTERVAL_S = 10.0  # between two self-test runs while the sustain window runs (s)
READY_TIMEOUT_S = 120.0  # the first run's wait for `ready` (s): the unit's TimeoutStartSec


def _say(msg: str) -> None:
    print(f"edge-trial: {msg}", flush=True)  # to the journal


def _plain_state(layout: DeviceLayout) -> dict | None:
    """The state file as plain JSON; None when there is none. Raises ValueError when unreadable."""
    try:
        data = json.loads(layout.state_file.read_bytes())
    except FileNotFoundError:
        return None
    if not isinstance(data, dict):
        raise ValueError(f"{layout.state_file} is not a JSON object")
    return data


def _on_trial(data: dict | None, live: str | None) -> bool:
    trial = (data or {}).get("trial") or {}
    return live is not None and trial.get("status") == "on_trial" and trial.get("slot") == live


def trial_slot(layout: DeviceLayout) -> str | None:
    """The live slot when it is on trial; None otherwise (nothing installed, committed, rolled back)."""
    try:
        data = _plain_state(layout)
    except (ValueError, OSError):
        return None
    live, _why = layout.live_slot()
    return live if _on_trial(data, live) else None


def needs_attention(layout: DeviceLayout) -> bool:
    """Whether a start has work to do: a trial to take a try from, what a killed installer left,
    a state that does not match ``current``. Standard library only: runs at every boot."""
    if layout.leftovers():
        return True
    try:
        data = _plain_state(layout)
    except (ValueError, OSError):
        return True  # recover keeps a corrupt state aside and rebuilds it from the slots
    if data is None:
        return False  # nothing was ever installed by edge-bundle install
    live, why = layout.live_slot()
    if why:
        return False  # current is not ours: nothing here can fix it (status says so)
    return live != data.get("live") or _on_trial(data, live)


def _try_taken_by_install(layout: DeviceLayout) -> bool:
    """Whether this start's try was taken already, by the install that restarts the unit (``install``:
    its state says so, and it left the token). Standard library only, like :func:`needs_attention`:
    it is the update's own restart, on the outage's critical path. The token is used once."""
    if layout.leftovers():
        return False
    try:
        data = _plain_state(layout)
        token = layout.try_taken_file.read_bytes()
    except (ValueError, OSError):
        return False
    live, _why = layout.live_slot()
    if not (_on_trial(data, live) and data is not None and data.get("live") == live):
        return False
    if token != try_token(data["trial"]):
        return False
    try:
        layout.try_taken_file.unlink()
    except FileNotFoundError:
        return False  # another start took it
    return True


def pre_start(layout: DeviceLayout) -> int:
    if not needs_attention(layout):
        return EXIT["done"]
    if _try_taken_by_install(layout):
        _say("slot on trial: this start's try was taken by the install that restarted it")
        return EXIT["done"]
    from edge.update.install.errors import InstallError, NotReady
    from edge.update.install.installer import HOOK_LOCK_WAIT_S, locked, on_trial, switch_back
    from edge.update.install.state import save_state

    try:
        with locked(layout, create=False, wait_s=HOOK_LOCK_WAIT_S) as (state, notes):
            for note in notes:
                _say(note)
            layout.try_taken_file.unlink(missing_ok=True)  # a stale one (another trial's) is never used
            live, _why = layout.live_slot()
            if not on_trial(state, live):
                return EXIT["done"]
            t = state.trial
            assert t is not None and live is not None  # on_trial: a trial, of the live slot
            if t.tries_left > 0:
                st = state.model_copy(deep=True)
                assert st.trial is not None  # a copy of t
                st.trial.tries_left -= 1
                st.add("try", live, f"start {t.tries - t.tries_left + 1} of {t.tries} on trial")
                save_state(layout, st)
                _say(f"slot {live} on trial: start {t.tries - t.tries_left + 1} of {t.tries}")
                return EXIT["done"]
            reason = (f"slot {live} was started {t.tries} times on trial without passing its self-test for the "
                      f"sustain window (a crash loop, a hang, or reboots)")
            try:
                st = switch_back(layout, state, live, reason)
            except NotReady as exc:
                _say(f"{reason}, but it cannot be rolled back ({exc}); it starts again")
                return EXIT["failed"]
            _say(f"rolled back to slot {st.live}: {reason}")
            return EXIT["rolled_back"]
    except InstallError as exc:  # the lock is held (an install runs): this start takes no try
        _say(f"no try taken: {exc}")
        return EXIT["failed"]


def _bundle_target(layout: DeviceLayout) -> tuple[str, str]:
    """(the live bundle's ipc address, its package directory)."""
    meta = json.loads((layout.current / "edge-bundle.json").read_text())
    return meta["address"], str(layout.current / PACKAGE_IN_BUNDLE)


def install_verdict(layout: DeviceLayout, slot: str, address: str):
    """What the install found about snapshots of ``slot``'s bundle (its record's ``snapshot``), as
    ``edge selftest``'s verdict on whether one can be taken here; None when the install did not try
    (``--no-snapshot``, an older installer, a state rebuilt from the slots): the start record says."""
    from edge.commands.selftest import SnapshotVerdict, snapshot_verdict
    from edge.update.install.state import StateError, load_state

    try:
        state = load_state(layout)
    except (StateError, OSError):
        return None
    name = next((s for s in SLOTS if s == slot), None)  # the slot as its SlotName, or None if not one
    rec = state.slots.get(name) if state is not None and name is not None else None
    note = rec.snapshot if rec is not None else None
    if note is None:
        return None
    if not note.taken:
        return SnapshotVerdict(False, f"edge-bundle install could not take one before the switch: {note.detail}")
    seen = snapshot_verdict(address)
    return SnapshotVerdict(True, f"edge-bundle install took one before the switch ({note.detail}); "
                                 f"the start record: {seen.why}")


def watch(layout: DeviceLayout, *, sustain_s: float = SUSTAIN_S, interval_s: float = INTERVAL_S,
          ready_timeout_s: float = READY_TIMEOUT_S, unit: str = "edge") -> int:
    """Run the self-test until it has passed for ``sustain_s`` (commit) or a check fails (rollback)."""
    slot = trial_slot(layout)
    if slot is None:
        _say("nothing on trial")
        return EXIT["done"]
    from edge.update.install.errors import NotReady
    from edge.update.install.installer import HOOK_LOCK_WAIT_S, mark_good
    from edge.ipc.client import EdgeClient
    from edge.commands.selftest import run_checks

    address, package = _bundle_target(layout)
    snapshots = install_verdict(layout, slot, address)
    client = EdgeClient(address, timeout_s=ready_timeout_s)
    first_pass, runs = None, 0
    try:
        while True:
            timeout = ready_timeout_s if first_pass is None else max(2.0, interval_s)
            report = run_checks(client, address, package, "the live slot's bundle", timeout, snapshots=snapshots)
            runs += 1
            if report.no_server:
                _say(f"slot {slot}: no answer on {address} within {timeout:.0f} s; the unit's restarts take the "
                     f"trial's tries")
                return EXIT["failed"]
            if not report.passed:
                bad = next(c for c in report.checks if c.passed is False)
                return _roll_back(layout, slot, f"self-test failed on run {runs}: {bad.name}: {bad.detail}", unit)
            now = time.monotonic()
            first_pass = first_pass or now
            if now - first_pass >= sustain_s:
                try:
                    _slot, what = mark_good(layout, trial_of=slot, wait_s=HOOK_LOCK_WAIT_S)
                except NotReady as exc:
                    _say(str(exc))
                    return EXIT["done"]
                _say(f"slot {slot}: self-test passed {runs} times over {now - first_pass:.0f} s: {what}")
                return EXIT["done"]
            time.sleep(max(0.0, min(interval_s, first_pass + sustain_s - time.monotonic())))
            if trial_slot(layout) != slot:
                _say(f"slot {slot}: the trial was ended by another command (mark-good, rollback, install)")
                return EXIT["done"]
    finally:
        client.close()


def on_failure(layout: DeviceLayout, unit: str = "edge") -> int:
    slot = trial_slot(layout)
    if slot is None:
        _say(f"{unit}.service failed, and no update is on trial: nothing to roll back")
        return EXIT["done"]
    import subprocess

    result = subprocess.run(["systemctl", "show", "-p", "Result", "--value", f"{unit}.service"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    return _roll_back(layout, slot, f"{unit}.service failed on trial and systemd stopped restarting it "
                                    f"(result: {result})", unit)


def _roll_back(layout: DeviceLayout, slot: str, reason: str, unit: str) -> int:
    """An automatic rollback of ``slot``'s trial: back to the previous slot, the unit's failures
    cleared and its restart queued (the watcher is stopped by that restart: it must not wait)."""
    from edge.update.install.errors import InstallError
    from edge.update.install.installer import HOOK_LOCK_WAIT_S, rollback

    try:
        _left, back, restarted = rollback(layout, reason=reason, block=False, reset_failed=True,
                                          only_on_trial=True, unit=unit, wait_s=HOOK_LOCK_WAIT_S)
    except InstallError as exc:
        _say(f"slot {slot}: {reason}; not rolled back: {exc}")
        return EXIT["failed"]
    _say(f"rolled back to slot {back}: {reason}; {restarted}")
    return EXIT["rolled_back"]


_seconds = number(float, "a number of seconds", ok=lambda v: v >= 0, rule="seconds >= 0")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="edge-trial", description="the update's trial around edge.service (docs/update.md)",
        epilog="exit status: 0 nothing to do, a try taken, or the trial committed; 1 rolled back; 2 usage; "
               "3 failed (no answer, nothing to roll back to, the lock held)")
    p.add_argument("hook", choices=("pre-start", "watch", "on-failure"),
                   help="pre-start: ExecStartPre= of edge.service; watch: edge-trial.service; "
                        "on-failure: edge-trial-failed.service (OnFailure= of edge.service)")
    p.add_argument("--root", type=Path, default=Path("/"), help="the device's root directory")
    p.add_argument("--unit", default="edge", help="the runtime's unit, without .service (default: edge)")
    p.add_argument("--sustain", type=_seconds, default=SUSTAIN_S, metavar="S",
                   help=f"watch: the self-test passes for S seconds before the trial commits (default {SUSTAIN_S:g})")
    p.add_argument("--interval", type=_seconds, default=INTERVAL_S, metavar="S",
                   help=f"watch: seconds between self-test runs (default {INTERVAL_S:g})")
    p.add_argument("--ready-timeout", type=_seconds, default=READY_TIMEOUT_S, metavar="S",
                   help=f"watch: the first run's wait for ready (default {READY_TIMEOUT_S:g})")
    args = p.parse_args(argv)
    layout = DeviceLayout(args.root)
    try:
        if args.hook == "pre-start":
            return pre_start(layout)
        if args.hook == "watch":
            return watch(layout, sustain_s=args.sustain, interval_s=args.interval,
                         ready_timeout_s=args.ready_timeout, unit=args.unit)
        return on_failure(layout, args.unit)
    except OSError as exc:
        _say(f"{args.hook} failed: {exc}")
        return EXIT["failed"]


if __name__ == "__main__":
    sys.exit(main())
