"""The install's snapshot before the switch, on a device root in a directory (the staging container
itself: tests/bundle/test_bundle_snapshot_supervise.py; under systemd with CRIU:
tests/install/test_trial_snapshot_systemd.py): when it is tried, what a result or a failure does
to the state, the history, status and the trial's verdict, and that it never stops an install."""

from __future__ import annotations

import json

import pytest

from edge.update.install import staging
from edge.update.install.installer import install
from edge.update.install.layout import DeviceLayout
from edge.update.install.state import load_state
from edge.update.install.status import render_text, status
from edge.update.install.trial import install_verdict

TAKEN = {"event": "supervise.staged", "taken": True, "reused": False, "path": "/var/cache/edge/x/snapshot",
         "snapshot_point_s": 2.35, "checkpoint_s": 0.34, "image_bytes": 160 << 20, "cpu_shares": 2}


@pytest.fixture
def system_root(monkeypatch):
    """Installs into a directory that the installer takes for the system's root, with edge-supervise's
    --stage-snapshot answering ``answer`` (a supervise.staged record, or None: no result) and the
    live unit's start record in ``start_record``; the commands it would have run are kept."""
    ran: list[list[str]] = []
    box: dict = {"answer": TAKEN}
    monkeypatch.setattr(DeviceLayout, "is_system_root", property(lambda self: True))
    monkeypatch.setattr(staging, "_unit_nofile", lambda unit: 20000)

    def run(cmd):
        ran.append(cmd)
        answer = box["answer"]
        return (None, "edge-supervise --stage-snapshot exited 1 without a result: boom") if answer is None else (
            dict(answer), "")

    monkeypatch.setattr(staging, "_run", run)
    box["ran"] = ran
    return box


def test_a_snapshot_taken_before_the_switch_is_recorded_and_tells_the_trial(root, archives, system_root, tmp_path,
                                                                           monkeypatch):
    monkeypatch.setattr(staging, "START_RECORD", str(tmp_path / "none.json"))
    layout = DeviceLayout(root)
    report = install(archives[1], layout, restart=False)
    assert report.staged.taken and "boot to the snapshot point 2.35 s, checkpoint 0.34 s, 160 MiB" in report.staged.detail
    (cmd,) = system_root["ran"]
    assert cmd[1:4] == ["-m", "edge.supervise", "--stage-snapshot"] and cmd[cmd.index("--id") + 1] == "edge-staging"
    assert cmd[cmd.index("--bundle") + 1] == str(layout.slot("a") / "bundle") and cmd[-2:] == ["--nofile-limit", "20000"]
    state = load_state(layout)
    assert state.slots["a"].snapshot.taken is True
    assert [h.event for h in state.history] == ["install", "snapshot"]
    assert "snapshot taken before the switch" in render_text(status(layout))
    verdict = install_verdict(layout, "a", "ipc:///run/edge/edge.sock")
    assert verdict.possible is True and "edge-bundle install took one before the switch" in verdict.why


@pytest.mark.parametrize("answer,says", [
    ({"event": "supervise.staged", "taken": False, "error": "/usr/sbin/criu is CRIU 3.17; a snapshot needs CRIU >= 4.1"},
     "CRIU 3.17"),
    (None, "without a result: boom"),
])
def test_a_snapshot_that_cannot_be_taken_never_stops_the_install(root, archives, system_root, tmp_path, monkeypatch,
                                                                answer, says):
    monkeypatch.setattr(staging, "START_RECORD", str(tmp_path / "none.json"))
    system_root["answer"] = answer
    layout = DeviceLayout(root)
    report = install(archives[1], layout, restart=False)
    assert layout.live_slot() == ("a", None) and not report.staged.taken and says in report.staged.detail
    state = load_state(layout)
    assert state.slots["a"].snapshot.taken is False and says in state.slots["a"].snapshot.detail
    entry = state.history[-1]
    assert entry.event == "snapshot" and entry.detail.startswith("none before the switch, so its first start is fresh")
    text = render_text(status(layout))
    assert "no snapshot before the switch (first start fresh)" in text and says in text
    verdict = install_verdict(layout, "a", "ipc:///run/edge/edge.sock")
    assert verdict.possible is False and says in verdict.why and "could not take one before the switch" in verdict.why


def test_no_snapshot_is_tried_for_a_unit_running_with_snapshots_off_or_with_no_snapshot(root, archives, system_root,
                                                                                        tmp_path, monkeypatch):
    record = tmp_path / "start.json"
    record.write_text(json.dumps({"format": 1, "address": "ipc:///run/edge/edge.sock", "snapshot": "off"}))
    monkeypatch.setattr(staging, "START_RECORD", str(record))
    layout = DeviceLayout(root)
    report = install(archives[1], layout, restart=False)
    assert system_root["ran"] == [] and not report.staged.taken and "--snapshot off" in report.staged.detail
    assert install_verdict(layout, "a", "ipc:///run/edge/edge.sock").possible is False
    report = install(archives[2], layout, restart=False, snapshot=False)  # --no-snapshot: not tried, not recorded
    assert report.staged is None and system_root["ran"] == []
    assert load_state(layout).slots["b"].snapshot is None and install_verdict(layout, "b", "x") is None


def test_another_root_takes_no_snapshot(root, archives):
    """--root other than /: a snapshot holds the paths it was taken at; nothing is tried or recorded."""
    layout = DeviceLayout(root)
    report = install(archives[1], layout, restart=False)
    assert report.staged is None and load_state(layout).slots["a"].snapshot is None
    assert [h.event for h in load_state(layout).history] == ["install"]


def test_the_staged_record_is_read_from_the_supervisors_output():
    out = "\n".join([json.dumps({"event": "supervise.nofile_capped", "source": "edge-supervise"}), "not json",
                     json.dumps({**TAKEN, "source": "edge-supervise"})])
    assert staging._staged_record(out)["taken"] is True
    assert staging._staged_record("nothing") is None
