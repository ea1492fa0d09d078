"""edge-trial's hooks on a device root in a directory (no systemd: tests/install/test_trial_systemd.py
runs them under a real one): the tries each start takes, the rollback when none is left, the
fast path that keeps pydantic off a committed device's boot, the hooks' refusal to touch a
committed slot."""

from __future__ import annotations

import json
import subprocess
import sys

from install_support import REPO_ROOT

from edge.update.install.installer import install, mark_good
from edge.update.install.layout import DeviceLayout
from edge.update.install.state import TRIAL_TRIES, load_state
from edge.update.install.trial import EXIT, main, needs_attention, on_failure, pre_start, trial_slot, watch


def _two_installed(root, archives) -> DeviceLayout:
    layout = DeviceLayout(root)
    install(archives[1], layout, restart=False)
    mark_good(layout)
    install(archives[2], layout, restart=False)  # slot b on trial, a committed before it
    return layout


def test_each_start_on_trial_takes_a_try_and_the_one_after_the_last_rolls_back(root, archives, capsys):
    layout = _two_installed(root, archives)
    assert trial_slot(layout) == "b" and needs_attention(layout)
    for left in range(TRIAL_TRIES - 1, -1, -1):
        assert pre_start(layout) == EXIT["done"]
        assert load_state(layout).trial.tries_left == left
    assert layout.live_slot() == ("b", None)  # the third try is still a start of slot b
    assert pre_start(layout) == EXIT["rolled_back"]
    state = load_state(layout)
    assert layout.live_slot() == ("a", None) and state.live == "a" and state.previous is None
    assert state.trial.status.value == "rolled_back" and "started 3 times" in state.trial.reason
    events = [h.event for h in state.history]
    assert events[-5:] == ["install", "try", "try", "try", "rollback"], events
    assert not needs_attention(layout) and trial_slot(layout) is None
    assert pre_start(layout) == EXIT["done"]  # the rolled-back slot is left alone
    assert "rolled back to slot a" in capsys.readouterr().out


def test_a_first_install_with_no_tries_left_has_nothing_to_roll_back_to(root, archives, capsys):
    layout = DeviceLayout(root)
    install(archives[1], layout, restart=False)
    for _ in range(TRIAL_TRIES):
        pre_start(layout)
    assert pre_start(layout) == EXIT["failed"]
    assert layout.live_slot() == ("a", None) and load_state(layout).trial.status.value == "on_trial"
    assert "cannot be rolled back" in capsys.readouterr().out


def test_hooks_leave_a_committed_slot_alone(root, archives):
    layout = _two_installed(root, archives)
    mark_good(layout)
    before = layout.state_file.read_bytes()
    assert not needs_attention(layout)
    assert pre_start(layout) == EXIT["done"]
    assert watch(layout, sustain_s=0) == EXIT["done"]  # nothing on trial: no client, no check
    assert on_failure(layout, unit="edge-test-none") == EXIT["done"]
    assert layout.state_file.read_bytes() == before and layout.live_slot() == ("b", None)


def test_leftovers_and_an_unrecorded_switch_need_the_slow_path(root, archives):
    layout = _two_installed(root, archives)
    mark_good(layout)
    (layout.slots_dir / "a.staging").mkdir()
    assert needs_attention(layout)
    assert pre_start(layout) == EXIT["done"] and not (layout.slots_dir / "a.staging").exists()
    data = json.loads(layout.state_file.read_text())
    data["live"] = "a"  # as if an install had switched current to b and been killed before recording
    layout.state_file.write_text(json.dumps(data))
    assert needs_attention(layout)
    pre_start(layout)
    state = load_state(layout)
    assert layout.live_slot() == ("a", None) and state.trial.status.value == "rolled_back"
    assert "before recording the install" in state.trial.reason


def test_pre_start_on_a_committed_device_does_not_import_pydantic(root, archives):
    layout = _two_installed(root, archives)
    mark_good(layout)
    code = ("import sys; from edge.update.install.trial import main; rc = main(['pre-start', '--root', sys.argv[1]]); "
            "print(rc, 'pydantic' in sys.modules, 'zmq' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, cwd=REPO_ROOT,
                         timeout=60)
    assert out.stdout.split() == ["0", "False", "False"], out.stderr


def _pre_start_in_a_new_process(root) -> list[str]:
    code = ("import sys; from edge.update.install.trial import main; rc = main(['pre-start', '--root', sys.argv[1]]); "
            "print(rc, 'pydantic' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, cwd=REPO_ROOT,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()[-2:]


def test_the_installs_own_restart_has_its_try_taken_and_its_pre_start_loads_no_pydantic(root, archives, monkeypatch):
    from edge.update.install import installer

    layout = DeviceLayout(root)
    install(archives[1], layout, restart=False)
    mark_good(layout)
    monkeypatch.setattr(installer, "restarts", lambda layout, wanted: wanted)  # as on the system's root
    monkeypatch.setattr(installer, "_systemctl", _systemctl_without_reload)  # a unit without ExecReload=
    monkeypatch.setattr(installer, "restart_unit", lambda *a, **k: "restarted (test)")
    report = install(archives[2], layout)
    assert report.restart.startswith("restarted (test) (no reload: Job type reload")
    state = load_state(layout)
    assert state.trial.tries_left == TRIAL_TRIES - 1 and state.history[-1].event == "try"
    assert "the install's restart" in state.history[-1].detail and layout.try_taken_file.exists()
    assert _pre_start_in_a_new_process(root) == ["0", "False"]  # the restart's start: its try is taken
    assert not layout.try_taken_file.exists() and load_state(layout).trial.tries_left == TRIAL_TRIES - 1
    assert pre_start(layout) == EXIT["done"]  # the next start takes a try of its own
    assert load_state(layout).trial.tries_left == TRIAL_TRIES - 2


def test_an_installs_reload_uses_the_try_it_took_and_starts_the_trials_watcher(root, archives, monkeypatch):
    from edge.update.install import installer

    layout = DeviceLayout(root)
    install(archives[1], layout, restart=False)
    mark_good(layout)
    calls: list[tuple[str, ...]] = []

    def systemctl(*args: str) -> subprocess.CompletedProcess:
        calls.append(args)
        return subprocess.CompletedProcess(["systemctl", *args], 0, "", "")

    monkeypatch.setattr(installer, "restarts", lambda layout, wanted: wanted)  # as on the system's root
    monkeypatch.setattr(installer, "_systemctl", systemctl)
    report = install(archives[2], layout)
    assert report.restart.startswith("reloaded edge.service")
    assert calls == [("daemon-reload",), ("reload", "edge.service"), ("restart", "--no-block", "edge-trial.service")]
    state = load_state(layout)
    assert state.trial.tries_left == TRIAL_TRIES - 1 and state.history[-1].event == "try"
    assert not layout.try_taken_file.exists()  # no pre-start runs at a reload: the token would grant a later start a try
    assert pre_start(layout) == EXIT["done"]  # the next (real) start takes a try of its own
    assert load_state(layout).trial.tries_left == TRIAL_TRIES - 2


def _systemctl_without_reload(*args: str) -> subprocess.CompletedProcess:
    if args[0] == "reload":
        return subprocess.CompletedProcess(["systemctl", *args], 1, "", f"Job type reload is not applicable for unit {args[1]}.")
    return subprocess.CompletedProcess(["systemctl", *args], 0, "", "")


def test_a_token_of_another_trial_is_not_a_try(root, archives):
    layout = _two_installed(root, archives)
    layout.try_taken_file.write_bytes(b"b 2026-01-01T00:00:00Z\n")  # left from an earlier trial of slot b
    assert pre_start(layout) == EXIT["done"]
    assert load_state(layout).trial.tries_left == TRIAL_TRIES - 1 and not layout.try_taken_file.exists()


def test_bad_arguments_exit_2(capsys):
    for argv in (["nope"], ["watch", "--sustain", "-1"], ["watch", "--interval", "x"]):
        try:
            main(argv)
        except SystemExit as exc:
            assert exc.code == EXIT["usage"], argv
        else:
            raise AssertionError(argv)
