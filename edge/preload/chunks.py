"""A package file's sha256 per chunk, so that several boot threads can check one file.

One sha256 over a file is serial: ``model.ort`` (90 MB) takes one core 55-65 ms, and on a
2-core device that hash was the last stage before READY while the other core sat idle. The
manifest's ``sha256_chunks`` section (written by ``image/package.py``) lists, for each file
larger than one chunk, the sha256 of every :data:`CHUNK_SIZE` bytes (the last chunk shorter).
The chunks are bound to the package as every digest in the manifest is (``package_sha256``,
the archive's signature), so checking every chunk is as strong as checking the file's sha256:
a file whose every chunk matches is byte for byte the file the builder hashed.

:class:`ChunkedHash` hands the chunks out one at a time to every thread that calls
:meth:`ChunkedHash.help`; hashlib releases the GIL over each 4 MiB, so threads hash in
parallel. On this 2-core machine two threads hash ``model.ort`` in 26 ms against 52 ms for one.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
from pathlib import Path

__all__ = ["ALGORITHM", "CHUNK_SIZE", "ChunkedHash", "chunk_count", "chunk_digests", "manifest_section"]

ALGORITHM = "sha256"
# 4 MiB: 22 chunks for MiniLM's model.ort, enough to share out among a few threads, and large
# enough that the per-chunk call (a lock, a slice) is noise beside the hash (about 2.5 ms each).
CHUNK_SIZE = 4 << 20


def chunk_count(size: int, chunk_size: int) -> int:
    """Chunks of a file of ``size`` bytes (an empty file has one, the empty chunk)."""
    return max(1, -(-size // chunk_size))


def chunk_digests(path: str | os.PathLike, chunk_size: int = CHUNK_SIZE) -> list[str]:
    """The hex sha256 of each ``chunk_size`` bytes of ``path``, in order."""
    mapped, view = _map(Path(path))
    try:
        size = len(view) if view is not None else 0
        return [_hash(view, k, chunk_size) for k in range(chunk_count(size, chunk_size))]
    finally:
        if view is not None and mapped is not None:
            view.release()
            mapped.close()


def manifest_section(root: Path, names: list[str], chunk_size: int = CHUNK_SIZE) -> dict:
    """The manifest's ``sha256_chunks``: the chunk digests of the ``names`` in ``root`` larger than
    one chunk (a smaller file's one chunk digest is its sha256, already in ``files``)."""
    big = [n for n in sorted(names) if (root / n).stat().st_size > chunk_size]
    return {"algorithm": ALGORITHM, "chunk_size": chunk_size,
            "digests": {n: chunk_digests(root / n, chunk_size) for n in big}}


class ChunkedHash:
    """The chunks of some files, each checked against its digest by whichever thread takes it.

    ``files``: (name, path, expected hex digests); the files are opened and mapped here, so a
    file that is missing raises here, in the caller's stage. Every thread that calls
    :meth:`help` takes chunks until none is left; :meth:`wait` returns once every chunk taken
    has been hashed, with the first mismatch found, and unmaps the files. After a mismatch no
    further chunk is handed out: the file is refused, and the rest need not be hashed.
    """

    def __init__(self, files: list[tuple[str, Path, list[str]]], chunk_size: int) -> None:
        self._chunk_size = chunk_size
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._maps: list[tuple[str, mmap.mmap | None, memoryview | None, list[str]]] = []
        self._todo: list[tuple[int, int]] = []  # (file index, chunk index), handed out from the end
        self._busy = 0  # chunks being hashed now
        self._mismatch: tuple[int, int] | None = None  # (file index, chunk index): the first found
        self._stopped = False
        self.threads: set[str] = set()  # names of the threads that hashed a chunk
        try:
            for i, (name, path, digests) in enumerate(files):
                self._maps.append((name, *_map(path), digests))
                self._todo.extend((i, k) for k in range(len(digests)))
        except BaseException:
            self._close()
            raise
        self._todo.reverse()  # pop() gives the first chunk of the first file first

    def help(self) -> int:
        """Hash chunks here until none is left to take; how many this call hashed."""
        done = 0
        me = threading.current_thread().name
        while True:
            with self._lock:
                if not self._todo or self._mismatch is not None or self._stopped:
                    return done
                i, k = self._todo.pop()
                self._busy += 1
            _, _, view, digests = self._maps[i]
            ok = False
            try:
                ok = _hash(view, k, self._chunk_size) == digests[k]
            finally:
                with self._lock:
                    self._busy -= 1
                    if not ok:
                        self._mismatch = min(self._mismatch or (i, k), (i, k))
                    self.threads.add(me)
                    self._idle.notify_all()
            done += 1

    def stop(self) -> None:
        """Hand out no more chunks (the check has failed elsewhere); :meth:`wait` still waits for
        the chunks being hashed."""
        with self._lock:
            self._stopped = True

    def wait(self) -> tuple[str, int] | None:
        """Hash what is left here, wait for the chunks other threads hold; then (file, chunk) of
        the first mismatch, or None when every chunk matched. Unmaps the files."""
        self.help()
        with self._lock:
            while self._busy:
                self._idle.wait()
            mismatch = self._mismatch
        self._close()
        return None if mismatch is None else (self._maps[mismatch[0]][0], mismatch[1])

    def _close(self) -> None:
        for _, mapped, view, _ in self._maps:
            if view is not None:
                view.release()
            if mapped is not None:
                mapped.close()
        self._maps = [(name, None, None, digests) for name, _, _, digests in self._maps]


def _map(path: Path) -> tuple[mmap.mmap | None, memoryview | None]:
    """A read-only mapping of ``path`` and a view of it; (None, None) for an empty file."""
    with open(path, "rb", buffering=0) as f:
        if os.fstat(f.fileno()).st_size == 0:
            return None, None
        mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    return mapped, memoryview(mapped)


def _hash(view: memoryview | None, k: int, chunk_size: int) -> str:
    """Hex sha256 of chunk ``k``: one call over the slice, so hashlib releases the GIL for it."""
    if view is None:
        return hashlib.sha256(b"").hexdigest()
    return hashlib.sha256(view[k * chunk_size:(k + 1) * chunk_size]).hexdigest()
