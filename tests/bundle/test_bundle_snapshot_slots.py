"""The snapshot of an installed slot's bundle, for real: ``edge-bundle snapshot --bundle
ROOT/opt/edge/bundle/current`` writes it outside the slot, in
``ROOT/var/cache/edge/<bundle_sha256>/snapshot``, where edge-supervise finds and accepts it; the
same bundle installed in the other slot refuses it (the snapshot names slot a's paths), and a
snapshot taken there replaces it.

Needs root, runc and CRIU >= 4.1; skipped otherwise. The device root is a directory below /tmp
that others can search (a restore's paths must be: test_bundle_snapshot.py), holding a private
copy of the cached bundle's config (support.bundles.private_bundle) as slot a.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from support.bundles import bundle_meta, criu_or_skip, private_bundle, runc_or_skip
from image.build_bundle import main
from edge.system import snapshot_rules as rules
from image.bundle import snapshot as S


def _use_slot(root: Path, slot: str) -> Path:
    current = root / "opt/edge/bundle/current"
    current.unlink(missing_ok=True)
    current.symlink_to(f"../slots/{slot}/bundle")
    return current


@pytest.fixture(scope="module")
def device_root(ort_bundle):
    runc_or_skip()
    criu_or_skip()
    work = Path(tempfile.mkdtemp(prefix="edge-slots-", dir="/tmp"))
    os.chmod(work, 0o711)
    try:
        root = work / "root"
        slot = root / "opt/edge/slots/a"
        slot.mkdir(parents=True)
        private_bundle(ort_bundle, work).rename(slot / "bundle")
        (slot / "edge-archive.json").write_text(json.dumps({"bundle_sha256": bundle_meta(ort_bundle)["bundle_sha256"]}))
        (root / "opt/edge/bundle").mkdir()
        _use_slot(root, "a")
        yield root
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _check(current: Path) -> str | None:
    """edge-supervise's verdict on the snapshot of ``current``, as before a start."""
    meta = bundle_meta(current)
    return rules.check_snapshot(rules.snapshot_dir(str(current)),
                                rules.dependencies(str(current), meta, "runc", shutil.which("criu") or "criu"))


def test_a_slots_snapshot_lives_outside_the_slot_keyed_by_the_bundles_digest(device_root, capsys):
    current = device_root / "opt/edge/bundle/current"
    sha = bundle_meta(current)["bundle_sha256"]
    cached = device_root / "var/cache/edge" / sha / "snapshot"
    assert main(["snapshot", "--bundle", str(current), "--quiet"]) == 0
    record = json.loads((cached / "snapshot.json").read_text())
    assert record["dependencies"]["bundle_path"] == str(device_root / "opt/edge/slots/a/bundle")
    assert sorted(os.listdir(device_root / "opt/edge/slots/a")) == ["bundle", "edge-archive.json"]
    assert sorted(os.listdir(device_root / "opt/edge/slots")) == ["a"]
    assert sorted(os.listdir(cached.parent)) == ["snapshot"]  # no staging left
    for d in (cached.parent, cached.parents[1], cached.parents[2]):
        assert stat.S_IMODE(d.stat().st_mode) == 0o755 and d.stat().st_uid == 0, d
    capsys.readouterr()
    assert main(["snapshot", "--bundle", str(current), "--check"]) == 0
    assert capsys.readouterr().out == f"{cached}: can be restored\n"
    assert _check(current) is None  # the supervisor restores what edge-bundle snapshot wrote


def test_the_same_bundle_in_the_other_slot_refuses_slot_as_snapshot_and_retakes_it(device_root, capsys):
    a, b = device_root / "opt/edge/slots/a", device_root / "opt/edge/slots/b"
    current = device_root / "opt/edge/bundle/current"
    cached = device_root / "var/cache/edge" / bundle_meta(current)["bundle_sha256"] / "snapshot"
    if not (cached / "snapshot.json").exists():
        S.take_snapshot(current)
    shutil.copytree(a, b, symlinks=True)
    _use_slot(device_root, "b")
    assert S.snapshot_dir(current) == cached  # one digest, one directory
    stale = f"taken for another bundle_path: '{a / 'bundle'}' -> '{b / 'bundle'}'"
    capsys.readouterr()
    assert main(["snapshot", "--bundle", str(current), "--check"]) == 1
    assert capsys.readouterr().out == f"{cached}: {stale}\n"
    assert _check(current) == stale
    S.take_snapshot(current)  # what edge-supervise does after the fresh start it falls back to
    assert S.check_snapshot(current) is None and _check(current) is None
    config = json.loads((cached / "config.json").read_text())
    assert config["process"]["args"][-1] == "--snapshot-point"
    assert S.check_snapshot(a / "bundle").startswith("taken for another bundle_path")
