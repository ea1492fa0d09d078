"""Installing into slots, switching current, the state file, status, rollback, mark-good."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from install_support import run_cli

from edge.update.install.layout import DeviceLayout
from edge.update.install.slots import check_slot
from edge.update.install.state import TRIAL_TRIES, TrialStatus, load_state


def _install(capsys, archive: Path, root: Path) -> tuple[int, str, str]:
    return run_cli(capsys, "install", archive, "--root", root)


def _status(capsys, root: Path) -> tuple[int, dict]:
    code, out, _ = run_cli(capsys, "status", "--root", root, "--json")
    return code, json.loads(out)


def _same_tree(src: Path, dst: Path) -> None:
    """dst holds src's files, modes, symlinks and file mtimes, owned by root."""
    for dirpath, dirnames, filenames in os.walk(src):
        for name in dirnames + filenames:
            a = Path(dirpath) / name
            b = dst / a.relative_to(src)
            sa, sb = os.lstat(a), os.lstat(b)
            assert stat.S_IFMT(sa.st_mode) == stat.S_IFMT(sb.st_mode), b
            assert (sb.st_uid, sb.st_gid) == (0, 0), b
            if stat.S_ISLNK(sa.st_mode):
                assert os.readlink(a) == os.readlink(b), b
                continue
            assert stat.S_IMODE(sb.st_mode) == stat.S_IMODE(sa.st_mode), b
            if stat.S_ISREG(sa.st_mode):
                assert int(sb.st_mtime) == int(sa.st_mtime), b  # the rootfs's .pyc files record their sources'
                assert a.read_bytes() == b.read_bytes(), b


def test_first_install_fills_slot_a_and_starts_a_trial(capsys, root, archives, bundles):
    code, out, err = _install(capsys, archives[1], root)
    assert code == 0, err
    assert "slot a" in out and "on trial" in out and "restart skipped" in out
    layout = DeviceLayout(root)
    assert os.readlink(layout.current) == "../slots/a/bundle"
    assert layout.live_slot() == ("a", None)
    _same_tree(bundles[1], layout.slot("a") / "bundle")
    assert check_slot(layout, "a", full=True) == []
    assert sorted(os.listdir(layout.slot("a"))) == ["bundle", "edge-archive.json", "edge-archive.sig"]
    assert sorted(os.listdir(layout.slots_dir)) == ["a"]  # no staging left
    state = load_state(layout)
    assert state.live == "a" and state.previous is None
    assert state.trial.status == TrialStatus.ON_TRIAL and state.trial.slot == "a"
    assert state.trial.tries == state.trial.tries_left == TRIAL_TRIES
    assert [h.event for h in state.history] == ["install"]
    assert state.slots["a"].archive == archives[1].name
    assert state.slots["a"].bundle_sha256 == json.loads((bundles[1] / "edge-bundle.json").read_text())["bundle_sha256"]
    assert stat.S_IMODE(os.stat(layout.state_file).st_mode) == 0o644


def test_installs_alternate_slots_and_never_touch_the_live_one(capsys, root, archives, bundles):
    layout = DeviceLayout(root)
    assert _install(capsys, archives[1], root)[0] == 0
    live_a = (layout.slot("a") / "bundle/config.json").stat().st_ino
    assert _install(capsys, archives[2], root)[0] == 0
    assert layout.live_slot() == ("b", None)
    assert (layout.slot("a") / "bundle/config.json").stat().st_ino == live_a  # slot a untouched
    _same_tree(bundles[2], layout.slot("b") / "bundle")
    state = load_state(layout)
    assert (state.live, state.previous) == ("b", "a")
    code, out, err = _install(capsys, archives[3], root)  # replaces slot a, the inactive one
    assert code == 0, err
    assert "rollback goes to slot b" in out
    assert layout.live_slot() == ("a", None)
    _same_tree(bundles[3], layout.slot("a") / "bundle")
    assert sorted(os.listdir(layout.slots_dir)) == ["a", "b"]  # no a.old, no staging
    state = load_state(layout)
    assert (state.live, state.previous) == ("a", "b")
    assert [h.event for h in state.history] == ["install"] * 3


def test_status_rollback_and_mark_good(capsys, root, archives):
    assert _install(capsys, archives[1], root)[0] == 0
    assert run_cli(capsys, "mark-good", "--root", root)[0] == 0
    code, report = _status(capsys, root)
    assert (code, report["health"], report["live"]) == (0, "committed", "a")
    assert _install(capsys, archives[2], root)[0] == 0
    code, report = _status(capsys, root)
    assert (code, report["health"], report["live"], report["previous"]) == (1, "on_trial", "b", "a")
    assert report["trial"]["tries_left"] == TRIAL_TRIES and report["problems"] == []
    code, text, _ = run_cli(capsys, "status", "--root", root)
    assert code == 1 and text.startswith("health: on_trial (exit 1)")
    assert "live:   slot b" in text and "(rollback goes here)" in text and "history:" in text

    code, out, err = run_cli(capsys, "rollback", "--root", root)
    assert code == 0, err
    assert "current -> slot a" in out
    layout = DeviceLayout(root)
    assert layout.live_slot() == ("a", None)
    code, report = _status(capsys, root)
    assert (code, report["health"], report["live"], report["previous"]) == (2, "rolled_back", "a", None)
    assert report["trial"]["reason"] == "manual"
    assert [h["event"] for h in report["history"]] == ["install", "commit", "install", "rollback"]
    code, text, _ = run_cli(capsys, "status", "--root", root)
    assert code == 2 and "rolled back to slot a" in text and "manual" in text

    code, _, err = run_cli(capsys, "rollback", "--root", root)  # nothing left to roll back to
    assert code == 2 and "nothing to roll back to" in err
    assert layout.live_slot() == ("a", None)

    code, out, _ = run_cli(capsys, "mark-good", "--root", root)
    assert code == 0 and "rollback acknowledged" in out
    assert _status(capsys, root)[0] == 0
    code, out, _ = run_cli(capsys, "mark-good", "--root", root)
    assert code == 0 and "already committed" in out


def test_status_and_the_others_on_an_empty_root(capsys, root):
    before = sorted(p for p in root.rglob("*"))
    code, report = _status(capsys, root)
    assert (code, report["health"], report["live"]) == (2, "broken", None)
    assert any("nothing is installed" in p for p in report["problems"])
    assert run_cli(capsys, "rollback", "--root", root)[0] == 2
    assert run_cli(capsys, "mark-good", "--root", root)[0] == 2
    assert sorted(p for p in root.rglob("*")) == before  # none of them wrote anything


def test_status_reports_a_damaged_live_slot(capsys, root, archives):
    assert _install(capsys, archives[1], root)[0] == 0
    (DeviceLayout(root).slot("a") / "bundle/config.json").unlink()
    code, report = _status(capsys, root)
    assert (code, report["health"]) == (2, "broken")
    assert any("missing bundle/config.json" in p for p in report["problems"])


def test_a_current_that_is_not_ours_is_left_alone(capsys, root, archives, bundles):
    layout = DeviceLayout(root)
    layout.bundle_dir.mkdir(parents=True)
    os.symlink(bundles[1], layout.current)  # a hand-made install: current -> some bundle
    code, _, err = _install(capsys, archives[1], root)
    assert code == 2 and "not a slot's bundle" in err
    assert os.readlink(layout.current) == str(bundles[1])
    assert not layout.staging("a").exists() and not layout.slot("a").exists()


def test_rollback_refuses_an_incomplete_previous_slot(capsys, root, archives):
    assert _install(capsys, archives[1], root)[0] == 0
    assert _install(capsys, archives[2], root)[0] == 0
    (DeviceLayout(root).slot("a") / "bundle/rootfs/usr/bin/python3").unlink()
    code, _, err = run_cli(capsys, "rollback", "--root", root)
    assert code == 2 and "slot a is not complete" in err
    assert DeviceLayout(root).live_slot() == ("b", None)


def test_install_needs_a_trusted_key_and_a_file(capsys, root, archives, tmp_path):
    code, _, err = _install(capsys, tmp_path / "nope.edgebundle", root)
    assert code == 2 and "cannot read" in err
    for p in (root / "etc/edge/keys").iterdir():
        p.unlink()
    code, _, err = _install(capsys, archives[1], root)
    assert code == 2 and "holds no *.pub key" in err


@pytest.mark.parametrize("argv", [["install", "x", "--crash-at", "nowhere"], ["install", "x", "--assume-free", "-1"]])
def test_usage_errors(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        run_cli(capsys, *argv)
    assert exc.value.code == 2


def test_install_enables_fsverity_on_the_package_or_says_why_not(capsys, root, keys, tmp_path):
    """A package whose manifest gives fs-verity digests: the install enables it on those files where
    the device can (this machine's kernel cannot: the note says the runtime hashes them) and goes on."""
    from support.archives import fake_bundle, pack
    from support.packages import write_small_package

    from edge.preload import verity

    bundle = fake_bundle(tmp_path / "b", 7, package=write_small_package)
    archive = pack(bundle, keys["trusted"][0], tmp_path / "v7.edgebundle")
    code, out, err = _install(capsys, archive, root)
    assert code == 0, err
    package = DeviceLayout(root).current / "rootfs/opt/edge/package"
    notes = [line for line in err.splitlines() if "fs-verity" in line]
    assert len(notes) == 1, err
    if verity.measure(package / "model.ort") is None:
        assert "fs-verity not available" in notes[0] and "hashes the package's files at each boot" in notes[0], err
    else:
        assert "fs-verity enabled on 2 package file(s)" in notes[0], err
    _same_tree(bundle, DeviceLayout(root).current)
