"""Unpack the archive's members into a staging directory as edge/update/archive's reader checks
them against the signed manifest: each member's name, type, mode, size, mtime and target before
it is yielded, a file's sha256 on the read that reaches its end (before that read's bytes are
returned, so the last chunk of a wrong file is never written), and after the last member that
the stream ends exactly (no extra member, the compression's checksum).

The staging directory is mode 0700 until the end and is never a path that is started, so the
part of a file written before its hash failed (the caller removes the whole directory) is no
unverified byte anywhere that runs. The manifest lists every directory before what it holds
and refuses set-user-ID and set-group-ID modes. Files get their mode and owner root as they
are created; directories get their modes last, deepest first (a 0555 directory would refuse
its own members). Files keep the archive's modification times: the rootfs's byte code records
its sources' mtimes, and a source that looks newer than its ``.pyc`` is compiled again at
every start on a read-only root.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from edge.update.install.archive import MANIFEST_NAME, SIGNATURE_NAME, DirEntry, FileEntry, Manifest, refusals
from edge.update.install.fsio import fsync_dir

__all__ = ["unpack", "UnpackStats"]

CHUNK = 1 << 20  # bytes per read/write


class UnpackStats:
    def __init__(self) -> None:
        self.files = 0
        self.dirs = 0
        self.symlinks = 0
        self.bytes = 0  # file content written


def unpack(reader, manifest: Manifest, manifest_bytes: bytes, signature: bytes, staging: Path,
           *, midway: Callable[[], None] = lambda: None) -> UnpackStats:
    """Fill ``staging`` (which must not exist) from ``reader``'s members (its head already read);
    ``midway`` is called once half the entries are written (the crash point ``mid-unpack``).
    Raises Refused("member") or Refused("archive"); the caller removes ``staging`` on any exception."""
    as_root = os.geteuid() == 0  # owners are set to root; a non-root run (a test root) keeps its own
    half = len(manifest.files) // 2
    os.mkdir(staging, 0o700)
    dirs: dict[Path, int] = {}  # path -> mode, applied at the end
    stats = UnpackStats()
    with refusals():
        for i, (entry, _member, content) in enumerate(reader.members(manifest), 1):
            path = staging / entry.path
            if isinstance(entry, FileEntry):
                stats.bytes += _write_file(path, content, entry, as_root)
                stats.files += 1
            elif isinstance(entry, DirEntry):
                os.mkdir(path, 0o700)
                dirs[path] = entry.mode
                stats.dirs += 1
            else:
                os.symlink(entry.target, path)
                if as_root:
                    os.lchown(path, 0, 0)
                stats.symlinks += 1
            if i == half:
                midway()
        reader.finish()
    for name, data in ((MANIFEST_NAME, manifest_bytes), (SIGNATURE_NAME, signature)):
        _write_bytes(staging / name, data, as_root)
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        if as_root:
            os.chown(d, 0, 0)
        os.chmod(d, dirs[d])
        fsync_dir(d)
    os.chmod(staging, 0o755)
    fsync_dir(staging)
    return stats


def _write_file(path: Path, content, entry: FileEntry, as_root: bool) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    n = 0
    try:
        while chunk := content.read(CHUNK):  # the read that completes the file checks its sha256 first
            _write_all(fd, chunk)
            n += len(chunk)
        if as_root:
            os.fchown(fd, 0, 0)
        os.fchmod(fd, entry.mode)
        os.utime(fd, (entry.mtime, entry.mtime))
        os.fsync(fd)
    finally:
        os.close(fd)
    return n


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _write_bytes(path: Path, data: bytes, as_root: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        _write_all(fd, data)
        if as_root:
            os.fchown(fd, 0, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
