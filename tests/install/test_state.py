"""The state file, the lock, and recover() on leftovers no crash point makes."""

from __future__ import annotations

import json
import os

import pytest
from install_support import run_cli

from edge.update.install.fsio import Busy, DirLock, atomic_write, switch_symlink
from edge.update.install.installer import install
from edge.update.install.layout import DeviceLayout
from edge.update.install.slots import recover
from edge.update.install.state import (HISTORY_LIMIT, InstallState, StateError, Trial, TrialStatus, load_state, now,
                                save_state)


def test_atomic_write_and_switch_leave_no_temporary_names(tmp_path):
    target = tmp_path / "install.json"
    atomic_write(target, b"one")
    atomic_write(target, b"two")
    assert target.read_bytes() == b"two" and os.listdir(tmp_path) == ["install.json"]
    link = tmp_path / "current"
    switch_symlink(link, "../slots/a/bundle")
    switch_symlink(link, "../slots/b/bundle")
    assert os.readlink(link) == "../slots/b/bundle" and sorted(os.listdir(tmp_path)) == ["current", "install.json"]


def test_state_round_trip_and_history_limit(tmp_path):
    layout = DeviceLayout(tmp_path)
    st = InstallState(live="a", trial=Trial(status=TrialStatus.ON_TRIAL, slot="a", tries=3, tries_left=2,
                                            since=now()))
    for i in range(HISTORY_LIMIT + 5):
        st.add("recover", None, f"note {i}")
    save_state(layout, st)
    back = load_state(layout)
    assert back == st and len(back.history) == HISTORY_LIMIT and back.history[-1].detail == f"note {HISTORY_LIMIT + 4}"
    data = json.loads(layout.state_file.read_text())
    assert data["format"] == 1 and data["trial"]["status"] == "on_trial"
    layout.state_file.write_text(json.dumps({**data, "trial": {**data["trial"], "tries_left": -1}}))
    with pytest.raises(StateError, match="tries_left"):
        load_state(layout)


def test_recover_removes_what_a_kill_between_two_calls_leaves(root, archives):
    layout = DeviceLayout(root)
    install(archives[1], layout, restart=False)
    install(archives[2], layout, restart=False)  # live b, previous a
    os.rename(layout.slot("a"), layout.old("a"))  # killed between the two renames of replace_slot
    (layout.staging("a") / "bundle").mkdir(parents=True)
    os.symlink("../slots/a/bundle", layout.bundle_dir / ".current.new-123")
    (layout.state_dir / ".install.json.tmp-123").write_text("{")
    state, notes = recover(layout)
    assert layout.leftovers() == [] and not layout.slot("a").exists()
    assert layout.live_slot() == ("b", None)
    assert state.previous is None and "a" not in state.slots  # nothing left to roll back to
    assert sum("removed" in n for n in notes) == 4
    assert load_state(layout) == state


def test_a_corrupt_state_is_kept_aside_and_rebuilt(capsys, root, archives):
    layout = DeviceLayout(root)
    install(archives[1], layout, restart=False)
    layout.state_file.write_text("{not json")
    code, out, _ = run_cli(capsys, "status", "--root", root, "--json")
    report = json.loads(out)
    assert (code, report["health"], report["live"]) == (1, "on_trial", "a")  # unproven until marked good
    assert any("kept as install.json.corrupt-" in n for n in report["notes"])
    names = sorted(p.name for p in layout.state_dir.iterdir())
    assert len(names) == 2 and names[0] == "install.json" and names[1].startswith("install.json.corrupt-")


def test_status_changes_nothing_while_another_run_holds_the_lock(capsys, root, archives):
    layout = DeviceLayout(root)
    install(archives[1], layout, restart=False)
    (layout.staging("b") / "bundle").mkdir(parents=True)  # as a running install would have it
    with DirLock(layout.state_dir):
        with pytest.raises(Busy):
            DirLock(layout.state_dir).acquire()
        code, out, _ = run_cli(capsys, "status", "--root", root, "--json")
        assert layout.staging("b").exists()
        assert any("is running" in n for n in json.loads(out)["notes"])
        code, _, err = run_cli(capsys, "install", archives[2], "--root", root)
        assert code == 2 and "another edge-bundle install" in err
    run_cli(capsys, "status", "--root", root)
    assert not layout.staging("b").exists()
