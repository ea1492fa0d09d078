"""prune_caches: the caches of the bundles in the slots stay, every other digest's goes, and
nothing else under /var/cache/edge is touched."""

from __future__ import annotations

import json
from pathlib import Path

from edge.update.install.cache import kept_digests, prune_caches
from edge.update.install.layout import DeviceLayout

A, B, STALE = "a" * 64, "b" * 64, "c" * 64


def _slot(layout: DeviceLayout, name: str, sha: str) -> None:
    d = layout.slot(name)
    (d / "bundle").mkdir(parents=True)
    (d / "edge-archive.json").write_text(json.dumps({"bundle_sha256": sha, "engine": "onnxruntime"}))


def _cache(layout: DeviceLayout, name: str) -> Path:
    d = layout.cache_root / name
    (d / "snapshot" / "images").mkdir(parents=True)
    (d / "snapshot" / "snapshot.json").write_text("{}")
    return d


def test_both_slots_caches_stay_and_a_stale_one_goes(tmp_path):
    layout = DeviceLayout(tmp_path)
    _slot(layout, "a", A)
    _slot(layout, "b", B)
    kept = [_cache(layout, A), _cache(layout, B)]
    stale = _cache(layout, STALE)
    assert kept_digests(layout) == {A, B}
    assert prune_caches(layout) == [str(stale)]
    assert not stale.exists() and all((d / "snapshot" / "snapshot.json").exists() for d in kept)
    assert prune_caches(layout) == []  # nothing left to do


def test_a_missing_or_unreadable_slot_keeps_nothing(tmp_path):
    layout = DeviceLayout(tmp_path)
    _slot(layout, "a", A)
    layout.slot("b").mkdir(parents=True)
    (layout.slot("b") / "edge-archive.json").write_text("not json")
    a, b = _cache(layout, A), _cache(layout, B)
    assert prune_caches(layout) == [str(b)]
    assert a.exists() and not b.exists()
    (layout.slot("a") / "edge-archive.json").unlink()  # no slot at all: every digest's cache goes
    assert prune_caches(layout) == [str(a)]


def test_other_names_are_never_touched(tmp_path):
    layout = DeviceLayout(tmp_path)
    _slot(layout, "a", A)
    others = [_cache(layout, "coldstart"), _cache(layout, STALE.upper()), _cache(layout, STALE[:63]),
              _cache(layout, STALE + "0"), _cache(layout, f"{STALE}.old")]
    (layout.cache_root / B).write_text("a file by a digest's name")
    outside = _cache(DeviceLayout(tmp_path / "elsewhere"), STALE)
    (layout.cache_root / ("d" * 64)).symlink_to(outside, target_is_directory=True)
    assert prune_caches(layout) == []
    assert all(d.is_dir() for d in others) and (layout.cache_root / B).is_file()
    assert (outside / "snapshot" / "snapshot.json").exists()  # a link is never followed


def test_no_cache_root_is_nothing_to_do(tmp_path):
    layout = DeviceLayout(tmp_path)
    _slot(layout, "a", A)
    assert prune_caches(layout) == []
    layout.cache_root.parent.mkdir(parents=True)
    layout.cache_root.write_text("")  # not even a directory
    assert prune_caches(layout) == []
