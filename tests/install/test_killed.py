"""A killed installer: `install --crash-at STEP` SIGKILLs itself after STEP; whatever it left,
`current` points at a complete slot, the next `status` cleans up and brings the state level
(an install killed between its switch and its record is undone: the previous slot is live
again, rolled back), and the install run again succeeds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from install_support import REPO_ROOT, run_cli, tree_digest
from support.archives import manifest_of_archive

from edge.update.install.cli import CRASH_POINTS
from edge.update.install.installer import install, mark_good
from edge.update.install.layout import DeviceLayout
from edge.update.install.slots import check_slot
from edge.update.install.state import load_state

# After each step: the live slot (install 3 goes to slot a; b is live) right after the kill,
# the live slot once the next run has recovered, and whether a staging directory is left.
EXPECTED = {
    "after-verify": ("b", "b", False),
    "mid-unpack": ("b", "b", True),
    "after-unpack": ("b", "b", True),
    "after-rename": ("b", "b", False),
    "after-switch": ("a", "b", False),  # switched, not recorded: undone
    "after-state": ("a", "a", False),  # recorded: on trial
}


def _digest_of(layout: DeviceLayout, slot: str) -> str:
    return json.loads((layout.slot(slot) / "edge-archive.json").read_text())["bundle_sha256"]


@pytest.mark.parametrize("step", CRASH_POINTS)
def test_killed_installer_leaves_a_complete_live_slot(capsys, root, archives, step):
    assert set(EXPECTED) == set(CRASH_POINTS)
    layout = DeviceLayout(root)
    for v in (1, 2):
        install(archives[v], layout, restart=False)
    mark_good(layout)
    digests = {v: manifest_of_archive(archives[v]).bundle_sha256 for v in (1, 2, 3)}
    before = tree_digest(root)

    proc = subprocess.run([sys.executable, "-m", "image.build_bundle", "install", str(archives[3]), "--root", str(root),
                           "--crash-at", step], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr

    killed_live, live, staging_left = EXPECTED[step]
    assert layout.live_slot() == (killed_live, None)
    assert check_slot(layout, killed_live, full=True) == []  # complete, every byte as signed
    assert _digest_of(layout, killed_live) == digests[3 if killed_live == "a" else 2]
    assert layout.staging("a").exists() is staging_left
    if step == "after-verify":
        assert tree_digest(root) == before  # nothing written before the checks passed

    code, out, _ = run_cli(capsys, "status", "--root", root, "--json")
    report = json.loads(out)
    assert layout.leftovers() == []
    assert report["live"] == live and layout.live_slot() == (live, None) and report["problems"] == []
    if step == "after-switch":
        assert (code, report["health"], report["previous"]) == (2, "rolled_back", None)
        assert "before recording the install" in report["trial"]["reason"]
        assert report["slots"]["a"]["bundle_sha256"] == digests[3]  # complete, never started
    elif live == "b":
        assert (code, report["health"]) == (0, "committed")
        expected_previous = None if step == "after-rename" else "a"  # slot a now holds the unswitched bundle 3
        assert report["previous"] == expected_previous
        assert report["slots"]["a"]["bundle_sha256"] == digests[3 if step == "after-rename" else 1]
    else:
        assert (code, report["health"], report["previous"]) == (1, "on_trial", "b")
        assert report["trial"]["slot"] == "a"
    if step in ("after-switch", "after-rename", "mid-unpack", "after-unpack"):
        assert report["notes"], step  # what recover found and did is said

    code, out, err = run_cli(capsys, "install", archives[3], "--root", root)
    assert code == 0, err
    new_live, _ = layout.live_slot()
    assert check_slot(layout, new_live, full=True) == [] and _digest_of(layout, new_live) == digests[3]
    assert sorted(os.listdir(layout.slots_dir)) == ["a", "b"]
    assert load_state(layout).live == new_live

