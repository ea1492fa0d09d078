"""The journal's segment files: append, rotate, delete the oldest, never above the cap.

Owned by the journal's writer thread. The cap (:class:`edge.observability.journal.budget.ByteCap`, shared with
the rejected samples) counts every segment file, the one being written included, and the count
is kept before the bytes reach the file: :meth:`SegmentFiles.append` first has the cap delete
the oldest segments or samples until the new line fits, then buffers it, so what is on disk
never exceeds ``max_bytes``, even for an instant. A segment is closed when the next line would
take it past ``segment_bytes`` (``max_bytes / 16``: deleting the oldest frees at most a
sixteenth of the journal at a time).

An entry counts as written when its bytes reach the kernel (:attr:`entries_flushed`), not when
it is buffered. A write that fails (ENOSPC, EDQUOT, EIO) loses the buffer: its entries are
counted in :attr:`entries_lost`, the bytes of that write that did reach the file are cut off
again (``ftruncate``, so the file ends with a whole line), and the segment is closed: the next
entry starts a new segment, with its own header and lineage record, so a lineage record lost
with the buffer is never missing under an entry that names it.

A process never appends to a segment it did not create: after a power cut the last segment may
end with a torn line (or, on ext4, zeros), and the reader skips what does not parse. A new
process starts a new segment, lazily at its first entry, so a runtime that restarts without
serving writes nothing. One runtime per directory: the writer holds an ``flock`` on
``.lock`` there, and a second runtime pointed at the same directory runs without a journal.

Buffered writes, no fsync: an fsync per entry would wear a device's eMMC and cost a
millisecond each; the buffer goes to the kernel every ``flush_s`` (~1 s) and when it holds
64 KiB, so a power cut loses at most the last second or so of entries.
"""

from __future__ import annotations

import fcntl
import os
from collections import deque

from edge.observability.journal.budget import FOUND, ByteCap
from edge.observability.journal.format import header_line, lineage_line, segment_name, segment_seq

__all__ = ["SegmentFiles", "list_segments", "BUFFER_BYTES", "SEGMENTS_PER_CAP"]

BUFFER_BYTES = 64 << 10  # written to the file when the buffer holds this much (bytes)
SEGMENTS_PER_CAP = 16  # segment size = cap / 16
MIN_SEGMENT_BYTES = 4 << 10  # bytes


def list_segments(directory: str) -> list[tuple[int, str, int]]:
    """``(seq, path, size)`` of every segment in ``directory``, oldest first."""
    out = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    for name in names:
        seq = segment_seq(name)
        if seq is None:
            continue
        path = os.path.join(directory, name)
        try:
            out.append((seq, path, os.stat(path).st_size))
        except FileNotFoundError:  # deleted by the writer meanwhile
            continue
    out.sort()
    return out


class JournalLocked(OSError):
    """Another runtime holds the journal directory's lock."""


class SegmentFiles:
    def __init__(self, directory: str, max_bytes: int, segment_bytes: int | None = None,
                 cap: ByteCap | None = None) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes or max(MIN_SEGMENT_BYTES, max_bytes // SEGMENTS_PER_CAP)
        if self.segment_bytes > max_bytes:
            raise ValueError(f"segment size {self.segment_bytes} exceeds the cap {max_bytes}")
        self.cap = cap if cap is not None else ByteCap(max_bytes)  # shared with the rejected samples
        self.cap.add(self)
        self.closed: deque = deque()  # [seq, path, size, stamp] of the segments not written to, oldest first
        self.closed_bytes = 0
        self.seq = 0  # the current segment's number (0: none open)
        self.size = 0  # its bytes, buffered ones included
        self.segments_created = 0
        self.entries_flushed = 0  # entries whose bytes reached the kernel
        self.entries_lost = 0  # entries buffered when a write failed
        self._fd = -1
        self._lock_fd = -1
        self._path = ""
        self._file_bytes = 0  # bytes of the current segment the kernel has
        self._buf: list[bytes] = []
        self._buf_bytes = 0
        self._buf_entries = 0
        self._lineages: set[str] = set()  # lineage ids recorded in the current segment

    # ------------------------------------------------------------ open, close

    def open(self) -> None:
        """Create the directory (0750), take its lock, and count what earlier runs left there."""
        os.makedirs(self.directory, mode=0o750, exist_ok=True)
        fd = os.open(os.path.join(self.directory, ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise JournalLocked(f"another runtime writes the journal in {self.directory} (its .lock is held)") from None
        self._lock_fd = fd
        last = 0
        for seq, path, size in list_segments(self.directory):
            try:
                stamp = (FOUND, os.stat(path).st_mtime_ns)
            except FileNotFoundError:
                continue
            self.closed.append([seq, path, size, stamp])
            self.closed_bytes += size
            last = max(last, seq)
        self._next = last + 1
        self.seq = 0

    @property
    def opened(self) -> bool:
        return self._lock_fd >= 0

    def close(self) -> None:
        try:
            self.flush()
        finally:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1

    @property
    def on_disk(self) -> int:
        """Bytes of every segment once the buffer is written; with the samples' bytes, never above
        the cap."""
        return self.closed_bytes + self.size

    @property
    def count(self) -> int:
        return len(self.closed) + (1 if self.seq else 0)

    @property
    def pinned(self) -> int:
        """Bytes the cap cannot delete: the segment being written."""
        return self.size

    @property
    def buffered_entries(self) -> int:
        return self._buf_entries

    def oldest_stamp(self):
        """The stamp of the oldest closed segment (for the cap), None when none is closed."""
        return self.closed[0][3] if self.closed else None

    def drop_oldest(self) -> int:
        seq, path, size, _ = self.closed.popleft()
        try:
            os.unlink(path)
        except FileNotFoundError:  # someone removed it: its bytes are gone all the same
            pass
        self.closed_bytes -= size
        return size

    # ------------------------------------------------------------ writing

    def append(self, line: bytes, lid: str, lineage: dict, pid: int) -> None:
        """Add one entry line (ending in a newline) whose lineage is ``lid``; rotate and delete as
        needed. Raises OSError (a failed write: the caller pauses or turns off the journal) and
        ValueError for a line larger than a segment can hold."""
        if len(line) > self.segment_bytes // 4:
            raise ValueError(f"entry of {len(line)} bytes, more than a quarter of a segment")
        try:
            if not self.seq or self.size + len(line) > self.segment_bytes:
                self._rotate(pid)
            if lid not in self._lineages:
                record = lineage_line(lid, lineage)
                if self.size + len(record) + len(line) > self.segment_bytes:
                    self._rotate(pid)
                self._put(record)
                self._lineages.add(lid)
        except OSError:
            self.entries_lost += 1  # this entry, not buffered yet
            raise
        self._put(line, entry=True)  # from here a failure counts it with the buffer

    def _put(self, data: bytes, entry: bool = False) -> None:
        try:
            self._make_room(len(data))
        except OSError:
            self.entries_lost += entry
            raise
        self._buf.append(data)
        self._buf_bytes += len(data)
        self._buf_entries += entry
        self.size += len(data)
        if self._buf_bytes >= BUFFER_BYTES:
            self.flush()

    def _make_room(self, n: int) -> None:
        """Have the cap delete the oldest segments or samples until ``n`` more bytes fit."""
        cap = self.cap
        if cap.used + n > cap.max_bytes:
            try:
                cap.make_room(n)
            except ValueError as exc:  # cannot happen while a segment <= cap / 4: the rest can go
                raise OSError(str(exc)) from None

    def _close_current(self) -> None:
        """Close the segment being written, as it is on disk (a rotation, or after a failed write)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self.seq:
            size = self._file_bytes
            if size:
                self.closed.append([self.seq, self._path, size, self.cap.stamp()])
                self.closed_bytes += size
            else:  # nothing of it reached the file
                try:
                    os.unlink(self._path)
                except FileNotFoundError:
                    pass
        self.seq, self.size, self._file_bytes = 0, 0, 0
        self._lineages = set()

    def _rotate(self, pid: int) -> None:
        self.flush()
        self._close_current()
        while True:  # O_EXCL: never an existing file, nor a link someone planted
            seq, self._next = self._next, self._next + 1
            path = os.path.join(self.directory, segment_name(seq))
            try:
                self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW
                                   | os.O_CLOEXEC, 0o640)
                break
            except FileExistsError:
                continue
        self.seq, self._path, self.size, self._file_bytes = seq, path, 0, 0
        self.segments_created += 1
        self._lineages = set()
        self._put(header_line(seq, pid))

    def flush(self) -> None:
        """Hand the buffer to the kernel (no fsync: see the module docstring). On OSError the
        buffer is lost, counted, cut from the file, and the segment closed (module docstring)."""
        if not self._buf or self._fd < 0:
            return
        data = b"".join(self._buf)
        entries = self._buf_entries
        self._buf, self._buf_bytes, self._buf_entries = [], 0, 0
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except OSError:
            self.entries_lost += entries
            self.size = self._file_bytes
            try:  # a line cut in the middle would hide the entry after it from the reader
                os.ftruncate(self._fd, self._file_bytes)
            except OSError:
                pass
            self._close_current()
            raise
        self._file_bytes += len(data)
        self.entries_flushed += entries
