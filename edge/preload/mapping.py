"""Map a whole file read-only at an address a C library can use.

``PROT_READ`` and ``MAP_PRIVATE``: the ONNX Runtime engine hands the mapping to
``CreateSessionFromArray``, and a stray write faults instead of silently copying.
Standard library only (no numpy), so the engine's boot thread can map and create its
session while the main thread is still importing numpy.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

from edge.errors import ErrorCode, PackageError

__all__ = ["MappedFile", "map_file"]

# dlopen(NULL): the symbols already in the process, libc's mmap among them.
# ctypes.util.find_library would fork /sbin/ldconfig on every boot.
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


class MappedFile:
    """A read-only private mapping of a whole file. ``address`` and ``size`` (bytes)."""

    def __init__(self, path: Path, address: int, size: int) -> None:
        self.path = path
        self.address = address
        self.size = size

    def close(self) -> None:
        if self.address:
            _libc.munmap(self.address, self.size)
            self.address = 0

    def __enter__(self) -> "MappedFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def map_file(path: str | os.PathLike, *, populate: bool = False) -> MappedFile:
    """Map ``path`` read-only. ``populate`` pre-faults the pages (still page cache, not anon)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError as exc:
        raise PackageError(f"cannot map {path.name}: not found", ErrorCode.PACKAGE_FILE_MISSING,
                           file=path.name) from exc
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            raise PackageError(f"cannot map {path.name}: empty file", ErrorCode.PACKAGE_SIZE_MISMATCH, file=path.name)
        flags = mmap.MAP_PRIVATE | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
        addr = _libc.mmap(None, size, mmap.PROT_READ, flags, fd, 0)
        if addr in (None, _MAP_FAILED):
            err = ctypes.get_errno()
            raise PackageError(f"cannot map {path.name}: {os.strerror(err)}", file=path.name)
        return MappedFile(path, addr, size)
    finally:
        os.close(fd)  # the mapping keeps its own reference to the file
