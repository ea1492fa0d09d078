"""Durable file-system steps of the installer: fsync a directory, write a file atomically,
switch a symlink atomically, take the installer's lock.

Each step is ordered so that a power cut or a SIGKILL between any two system calls leaves
either the old or the new state on disk, never a mix: a new name only ever appears by
``rename(2)``, and the directory holding it is fsynced after the rename, because the rename
itself is only durable once its directory is (ext4 ``data=ordered`` keeps file data before
metadata, not the order of two renames in different directories).
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

__all__ = ["fsync_dir", "atomic_write", "switch_symlink", "DirLock", "Busy"]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """``path`` holds ``data`` or what it held before, never a part: temp file, fsync, rename, dir fsync."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(data)
        os.fchmod(fd, mode)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.rename(tmp, path)
    fsync_dir(path.parent)


def switch_symlink(link: Path, target: str) -> None:
    """Point ``link`` at ``target`` in one step: a new symlink under a temporary name renamed over
    the old one (``ln -sfn`` unlinks first, leaving a moment with no link at all)."""
    tmp = link.with_name(f".{link.name}.new-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    try:
        os.rename(tmp, link)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(link.parent)


class Busy(RuntimeError):
    """Another installer (install, rollback, mark-good, status's clean-up) holds the lock."""


class DirLock:
    """An exclusive ``flock`` on a directory, not on a lock file: taking it writes nothing, so
    a refused install leaves the device byte-identical. The kernel drops it when the process
    dies, SIGKILL included."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fd: int | None = None

    def acquire(self, wait_s: float = 0.0) -> None:
        """Take the lock, waiting up to ``wait_s`` for another holder to finish (a ``status``
        holds it for milliseconds; an install for seconds)."""
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise Busy(f"another edge-bundle install, rollback or mark-good is running "
                               f"(it holds the lock on {self.directory}); try again when it is done") from None
                time.sleep(0.05)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "DirLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
