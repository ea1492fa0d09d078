"""Where a bundle's snapshot lives, by the rule of image/bundle/snapshot.py and of edge-supervise
(edge/system/snapshot_rules.py ``snapshot_dir``): an installed slot's bundle keeps it outside the slot,
in ``ROOT/var/cache/edge/<bundle_sha256>/snapshot``; any other bundle beside itself, in
``<bundle>.snapshot``. Paths only: no container runs (tests/bundle/test_bundle_snapshot_slots.py
takes a real one)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from image.bundle import snapshot as S

REPO = Path(__file__).resolve().parents[2]
SHA = "5e" * 32


@pytest.fixture(scope="module")
def sup():
    """edge-supervise's rule (edge/system/snapshot_rules.py)."""
    from edge.system import snapshot_rules

    return snapshot_rules


def _installed(root: Path, slot: str = "a", sha: str = SHA, archive: bool = True) -> Path:
    """ROOT/opt/edge/slots/SLOT/{edge-archive.json, bundle/edge-bundle.json} and ``current``; the bundle."""
    bundle = root / "opt/edge/slots" / slot / "bundle"
    bundle.mkdir(parents=True)
    (bundle / "edge-bundle.json").write_text(json.dumps({"bundle_sha256": sha, "address": "ipc:///run/edge/edge.sock"}))
    if archive:
        (bundle.parent / "edge-archive.json").write_text(json.dumps({"bundle_sha256": sha}))
    current = root / "opt/edge/bundle/current"
    current.parent.mkdir(parents=True, exist_ok=True)
    if current.is_symlink():
        current.unlink()
    current.symlink_to(f"../slots/{slot}/bundle")
    return bundle


def _both(sup, bundle: Path) -> str:
    """The snapshot directory of ``bundle``, by edge-bundle snapshot (a Path) and edge-supervise (a str)."""
    image = S.snapshot_dir(bundle)
    assert isinstance(image, Path) and sup.snapshot_dir(str(bundle)) == str(image)
    return str(image)


def test_a_slots_bundle_keeps_its_snapshot_in_the_cache_keyed_by_its_digest(sup, tmp_path):
    root = tmp_path / "root"
    bundle = _installed(root, "a")
    cached = str(root.resolve() / "var/cache/edge" / SHA / "snapshot")
    assert _both(sup, bundle) == cached
    assert _both(sup, root / "opt/edge/bundle/current") == cached  # what edge.service passes
    _installed(root, "b")  # the same digest in the other slot: the same directory, for its record to refuse
    assert _both(sup, root / "opt/edge/slots/b/bundle") == cached
    assert _both(sup, root / "opt/edge/bundle/current") == cached


def test_any_other_bundle_keeps_it_beside_itself(sup, tmp_path):
    plain = tmp_path / "v3"
    plain.mkdir()
    (plain / "edge-bundle.json").write_text(json.dumps({"bundle_sha256": SHA}))
    link = tmp_path / "current"
    link.symlink_to("v3")
    assert _both(sup, plain) == _both(sup, link) == f"{plain.resolve()}.snapshot"
    assert _both(sup, tmp_path / "absent") == f"{(tmp_path / 'absent').resolve()}.snapshot"


@pytest.mark.parametrize("case", ["no archive", "slot c", "not opt/edge/slots", "not named bundle",
                                  "digest not hex", "digest a path", "no digest", "metadata not json"])
def test_a_bundle_that_is_not_exactly_an_installed_slots_keeps_it_beside_itself(sup, tmp_path, case):
    root = tmp_path / "root"
    if case == "slot c":
        bundle = _installed(root, "c")
    elif case == "not opt/edge/slots":
        os.renames(_installed(root, "a").parent.parent, root / "opt/edge/other")
        bundle = root / "opt/edge/other/a/bundle"
    elif case == "not named bundle":
        bundle = _installed(root, "a")
        bundle = bundle.rename(bundle.with_name("bundle2"))
    else:
        bundle = _installed(root, "a", archive=case != "no archive")
        meta = bundle / "edge-bundle.json"
        if case == "digest not hex":
            meta.write_text(json.dumps({"bundle_sha256": "Z" * 64}))
        elif case == "digest a path":
            meta.write_text(json.dumps({"bundle_sha256": "../../../../etc"}))
        elif case == "no digest":
            meta.write_text(json.dumps({}))
        elif case == "metadata not json":
            meta.write_text("[")
    assert _both(sup, bundle) == f"{bundle.resolve()}.snapshot"


def test_the_cache_directories_are_made_0755_whatever_the_umask(sup, tmp_path):
    from edge.system.socket_dir import make_parents

    for name, make in (("image", S.make_parents), ("supervise", make_parents)):
        snap = tmp_path / name / "var/cache/edge" / SHA / "snapshot"
        (tmp_path / name).mkdir(mode=0o711)
        old = os.umask(0o077)
        try:
            make(snap)
            make(snap)  # again: nothing to do
        finally:
            os.umask(old)
        assert not snap.exists()  # the snapshot itself is the taker's to make (a staging directory renamed)
        for d in (snap.parent, snap.parents[1], snap.parents[2], snap.parents[3]):
            assert stat.S_IMODE(d.stat().st_mode) == 0o755, (name, d)
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o711  # what was there stays as it was


def test_a_snapshot_recorded_for_another_bundle_path_is_refused(sup, tmp_path):
    """The supervisor's check, given the dependencies (computing them runs runc and criu: the
    container tests do that): only the bundle's path differs, and that alone refuses it."""
    snap = tmp_path / "snap"
    (snap / "images").mkdir(parents=True)
    (snap / "images" / "pages-1.img").write_bytes(b"x" * 10)
    (snap / "config.json").write_text(json.dumps({"root": {"path": "/usr"}, "mounts": []}))
    deps = {"bundle_sha256": SHA, "bundle_path": "/opt/edge/slots/a/bundle", "kernel": "k"}
    (snap / "snapshot.json").write_text(json.dumps({"format": sup.SNAPSHOT_FORMAT, "dependencies": deps,
                                                    "images": {"pages-1.img": 10}}))
    assert sup.check_snapshot(str(snap), deps) is None
    why = sup.check_snapshot(str(snap), {**deps, "bundle_path": "/opt/edge/slots/b/bundle"})
    assert why == "taken for another bundle_path: '/opt/edge/slots/a/bundle' -> '/opt/edge/slots/b/bundle'"
