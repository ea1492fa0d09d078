"""The caches of installed bundles: ``ROOT/var/cache/edge/<bundle_sha256>/`` (layout.py).

Engine caches and snapshots belong to a bundle, not to a slot, so they live outside the slots,
keyed by the bundle's digest (edge/system/snapshot_rules.py ``snapshot_dir``
put a slot's snapshot in ``<digest>/snapshot``). A bundle installed again, or rolled back to,
finds its own; a bundle in neither slot can never be started again without a new install, so
its cache goes when a slot is replaced (:func:`prune_caches`).
"""

from __future__ import annotations

import json
import os
import shutil

from edge.update.install.layout import SLOT_MANIFEST, SLOTS, DeviceLayout

__all__ = ["prune_caches", "kept_digests"]

_HEX = frozenset("0123456789abcdef")


def _is_digest(name: str) -> bool:
    return len(name) == 64 and set(name) <= _HEX


def kept_digests(layout: DeviceLayout) -> set[str]:
    """The ``bundle_sha256`` of each slot's edge-archive.json; a slot that is missing, or whose
    manifest does not read as JSON with a digest, keeps nothing."""
    kept = set()
    for name in SLOTS:
        try:
            sha = json.loads((layout.slot(name) / SLOT_MANIFEST).read_bytes()).get("bundle_sha256")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(sha, str) and _is_digest(sha):
            kept.add(sha)
    return kept


def prune_caches(layout: DeviceLayout) -> list[str]:
    """Remove each ``ROOT/var/cache/edge/<sha>/`` whose ``sha`` (64 lowercase hex digits) is the digest
    of neither slot's bundle; the paths removed, sorted. Other names there (``coldstart``), and
    files or symlinks by a digest's name, are never touched; no cache root is nothing to do.
    Run it after a slot was replaced, with the installer's lock held."""
    try:
        names = sorted(os.listdir(layout.cache_root))
    except (FileNotFoundError, NotADirectoryError):
        return []
    kept = kept_digests(layout)
    removed = []
    for name in names:
        path = layout.cache_dir(name)
        if _is_digest(name) and name not in kept and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
            removed.append(str(path))
    return removed
