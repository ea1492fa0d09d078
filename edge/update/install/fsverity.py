"""fs-verity on the package's files of an unpacked bundle, where the device can have it.

The installer runs :func:`enable_package_verity` on the staging directory once every member
has been written and checked against the signed manifest, before the slot is renamed into
place. For each file the package's manifest gives an fs-verity digest for
(``fsverity.digests``, image/package.py), it enables fs-verity (``FS_IOC_ENABLE_VERITY``,
``edge/preload/verity.py``) and checks the digest the kernel then measures against the
manifest's. The runtime's boot compares that measured digest instead of hashing the file
(about 90 MB for MiniLM's ``model.ort``): microseconds instead of 70-180 ms.

Nothing depends on it. Where the kernel has no fs-verity (CONFIG_FS_VERITY), the file
system lacks the feature (ext4: ``tune2fs -O verity``) or the package names no digests, the
install goes on and says so in its notes; the boot then hashes the files, and its timeline says
which check it used (``verified_by``). A file with fs-verity enabled is read-only for good, to
root too: a slot is replaced or removed, never edited (replace_slot, recover), which unlinking
allows.
"""

from __future__ import annotations

import os
from pathlib import Path

from edge.preload import verity
from edge.update.install.layout import PACKAGE_IN_BUNDLE

__all__ = ["enable_package_verity"]


def enable_package_verity(bundle: Path) -> list[str]:
    """Enable fs-verity on the package files of the bundle at ``bundle``; what was done, in words
    for the install's notes (an empty list: the package names no digests, or the bundle none)."""
    from edge.errors import PackageError
    from edge.preload.manifest import open_package

    root = bundle / PACKAGE_IN_BUNDLE
    if not (root / "manifest.json").is_file():
        return []
    try:
        digests = open_package(root, verify="none").manifest.fsverity  # the manifest's own checks only
    except PackageError as exc:  # the archive's signature covered it: the boot will say the same, by name
        return [f"fs-verity not enabled: the package's manifest is refused ({exc})"]
    names = [n for n in sorted(digests) if (root / n).is_file()]  # a bundle holds one engine's files
    if not names:
        return []
    enabled: list[str] = []
    differ: list[str] = []
    for name in names:
        try:
            measured = verity.enable(root / name)
        except verity.Unsupported as exc:
            return [f"fs-verity not available for {root} ({os.strerror(exc.errno or 0)}): the runtime hashes the "
                    f"package's files at each boot"]
        except OSError as exc:
            return [f"fs-verity not enabled on {name} ({exc}): the runtime hashes the package's files at each boot"]
        (enabled if measured == digests[name] else differ).append(name)
    notes = [f"fs-verity enabled on {len(enabled)} package file(s) ({', '.join(enabled)}): the runtime checks "
             f"their measured digests instead of hashing them"] if enabled else []
    if differ:  # the content matched the signed sha256: the manifest's fs-verity digest is the wrong one
        notes.append(f"warning: the fs-verity digest of {', '.join(differ)} differs from the manifest's: the runtime "
                     f"hashes {'it' if len(differ) == 1 else 'them'} at each boot (rebuild the package)")
    return notes
