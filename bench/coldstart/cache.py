"""Cold page cache: which files to evict, evicting them, and checking that it worked.

The eviction set is derived from real runs, not guessed: the files the runtime opened and
mapped (a traced boot, image/bundle/trace.py, plus ``/proc/PID/maps`` while it serves), the
files the baseline and the import probe opened and mapped (``--list-files``), the model
package, the baseline's model directory and every file of the virtual environment.

``posix_fadvise(POSIX_FADV_DONTNEED)`` drops a file's clean, unmapped pages. What it cannot
drop: pages some live process maps (this benchmark's own interpreter, libzmq, libc), and the
dentry/inode caches (only ``drop_caches`` clears those; ``--drop-caches`` uses it where the
kernel lets us write it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import stat
import sys
import time
from pathlib import Path
from typing import Iterable

__all__ = ["EvictionSet", "evict", "drop_caches", "resident_bytes", "tree_files", "other_mappers"]

# Never fadvise these: pseudo-filesystems. (tmpfs files are harmless: their pages just stay.)
_SKIP_PREFIXES = ("/proc/", "/sys/", "/dev/", "/memfd:")


def tree_files(root: Path) -> Iterable[str]:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            yield os.path.join(dirpath, name)


def _keep(path: str) -> bool:
    return path.startswith("/") and not path.startswith(_SKIP_PREFIXES)


class EvictionSet:
    """A de-duplicated list of regular files, with where each group came from (for the record)."""

    def __init__(self) -> None:
        self.files: dict[str, int] = {}  # path -> size (bytes)
        self.sources: dict[str, int] = {}  # source label -> files it added

    def add(self, label: str, paths: Iterable[str]) -> None:
        added = 0
        for p in paths:
            p = os.path.realpath(p)
            if p in self.files or not _keep(p):
                continue
            try:
                st = os.stat(p)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                self.files[p] = st.st_size
                added += 1
        self.sources[label] = self.sources.get(label, 0) + added

    def add_tree(self, label: str, root: Path) -> None:
        if root.is_dir():
            self.add(label, tree_files(root))

    @property
    def total_bytes(self) -> int:
        return sum(self.files.values())

    def summary(self) -> dict:
        return {"files": len(self.files), "bytes": self.total_bytes, "sources": dict(self.sources)}


def evict(paths: Iterable[str]) -> dict:
    """fadvise DONTNEED every file; returns files, bytes, errors and the time it took (ms)."""
    t = time.perf_counter()
    n = nbytes = errors = 0
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            errors += 1
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += 1
            nbytes += os.fstat(fd).st_size
        except OSError:
            errors += 1
        finally:
            os.close(fd)
    return {"files": n, "bytes": nbytes, "errors": errors, "ms": round((time.perf_counter() - t) * 1e3, 1)}


def drop_caches() -> str | None:
    """``sync; echo 3 > /proc/sys/vm/drop_caches``; None when done, else why it could not."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return None
    except OSError as exc:
        return f"drop_caches not allowed here ({exc.strerror}); used posix_fadvise only"


_libc = None


def _mincore_libc():
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
        _libc = libc
    return _libc


def resident_bytes(paths: Iterable[str]) -> int | None:
    """Bytes of these files now in the page cache (mincore on a fresh mapping; maps fault nothing in)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = _mincore_libc()
    page = mmap.PAGESIZE
    total = 0
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                continue
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                continue
            try:
                pages = (size + page - 1) // page
                vec = ctypes.create_string_buffer(pages)
                if libc.mincore(addr, size, vec) == 0:
                    total += sum(b & 1 for b in vec.raw) * page
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
    return total


def other_mappers(paths: Iterable[str]) -> dict[int, str]:
    """Live processes (not this one) that map any of ``paths``: pid -> command line.

    Their mapped pages stay resident whatever we evict, so a cold run is only as cold as
    the files nobody else maps (stop the installed service; use a package copy of your own).
    """
    wanted = set(paths)
    out: dict[int, str] = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/maps") as f:
                hit = any(len(parts) == 6 and parts[5].strip() in wanted for parts in (ln.split(None, 5) for ln in f))
            if hit:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    out[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:160]
        except OSError:
            continue
    return out
