"""A small real tmpfs for the tests of a full disk: mount(2) through ctypes (root only; no
process is started), unmounted on exit however the test ends."""

from __future__ import annotations

import contextlib
import ctypes
import os
from pathlib import Path

import pytest

_MNT_DETACH = 2  # umount2: detach now, even while a file is still open there


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str, path: Path) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}", str(path))


@contextlib.contextmanager
def tmpfs(path: Path, size_bytes: int):
    """``path`` (created) as a tmpfs of ``size_bytes`` (a multiple of 4 KiB) for the ``with`` block;
    skips the test where it cannot be mounted (not root, no CAP_SYS_ADMIN in a container)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    libc = _libc()
    if libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", 0, f"size={size_bytes},mode=0755".encode()) != 0:
        pytest.skip(f"cannot mount a tmpfs here: {os.strerror(ctypes.get_errno())}")
    try:
        yield path
    finally:
        _check(libc.umount2(os.fsencode(path), _MNT_DETACH), "umount", path)


def used_bytes(path: Path) -> int:
    """Bytes the file system at ``path`` has allocated (a tmpfs: its files' pages)."""
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def fill(path: Path, leave_bytes: int) -> Path:
    """A filler file that leaves ``leave_bytes`` free on the file system at ``path``'s directory."""
    st = os.statvfs(path.parent)
    size = st.f_bavail * st.f_frsize - leave_bytes
    with open(path, "wb") as f:
        f.write(b"\0" * max(size, 0))
    return path
