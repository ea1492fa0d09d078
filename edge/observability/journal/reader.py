"""Reading the journal: an entry by its trace id, the last entries, how far back it reaches.

Lookup reads each segment, newest first, in chunks of :data:`_CHUNK` bytes and searches them
for ``\\n{"t":"<trace id>"`` with ``bytes.find`` (C, at memory speed: see bench/journal_lookup.py
for the figures). The needle starts with a newline, so a hit is the start of a line, which the
writer begins only with an entry; the line must end with its newline (a line torn by a power
cut does not, and is left out) and pass :func:`edge.observability.journal.checks.entry`. The entry's lineage
is the segment's lineage record of the same id (``\\n{"L":"<id>"``), written before the first
entry that names it.

The runtime's user can write these files and ``edge trace`` runs as root, so nothing here
trusts them (``edge/observability/journal/checks.py``): segments are opened relative to the directory, as
regular files only, never through a symlink; a line is at most ``MAX_LINE`` bytes, read from
the chunk it starts in; a bad line is counted in a :class:`~edge.observability.journal.checks.Skipped`
(``skipped=``) and the search goes on past it. Segments are read, not mapped: a file truncated
by its owner while it is read shortens the read instead of killing the reader with SIGBUS.
A segment over :data:`MAX_SEGMENT_BYTES` is refused, and one command reads at most
:data:`MAX_READ_BYTES` in all.

Segments may be deleted by a running writer while they are read: a segment that vanished
before it was opened is skipped, one already open stays readable (Linux keeps an unlinked
file until it is closed). Standard library only: ``edge trace`` must start fast.
"""

from __future__ import annotations

import os

from edge.observability.journal.checks import MAX_LINE, Bad, Refused, Skipped, check_mode, entry, lineage_record, open_regular
from edge.observability.journal.format import ENTRY_START, LINEAGE_START, segment_seq

__all__ = ["find", "last", "extent", "Found", "Skipped", "MAX_SEGMENT_BYTES", "MAX_READ_BYTES"]

_CHUNK = 16 << 20  # bytes searched at a time at most; a read holds MAX_LINE more, so a line starting in it is whole
_FIRST = 256 << 10  # bytes searched first (then twice as many each time, up to _CHUNK)
MAX_SEGMENT_BYTES = 2 << 30  # a segment is cap / 16: a 32 GiB journal's; a larger file is refused
MAX_READ_BYTES = 32 << 30  # bytes one lookup reads in all (a journal of the largest segments), then it stops


class Found:
    """An entry, the lineage it names, and the segment it is in."""

    __slots__ = ("entry", "lineage", "segment")

    def __init__(self, entry: dict, lineage: dict | None, segment: str) -> None:
        self.entry, self.lineage, self.segment = entry, lineage, segment


class _Segment:
    """One open segment: chunks read with ``preadv`` into one reused buffer (no page faults for a
    fresh 16 MiB each time), needles found in them, lines checked. A search starts with a chunk of
    :data:`_FIRST` bytes and doubles it up to :data:`_CHUNK`: the newest entries and the lineage
    records, near the segment's ends, cost a few hundred KiB of reading, not a chunk. A search
    owns the buffer while it runs: lineage records are looked up through a second one (``side``),
    in the middle of a search of entries."""

    def __init__(self, fd: int, size: int, path: str, skipped: Skipped, buf: bytearray,
                 side: bytearray | None = None) -> None:
        self.fd, self.size, self.path, self.skipped, self.buf, self.side = fd, size, path, skipped, buf, side
        self.valid = 0  # bytes of buf read from the file

    def close(self) -> None:
        os.close(self.fd)

    def _read(self, offset: int, n: int) -> int:
        """Read up to ``n`` bytes at ``offset`` into the buffer; how many came (0: the end, or the bound)."""
        if self.skipped.read_bytes >= MAX_READ_BYTES:
            self.skipped.unread = True
            n = 0
        n = max(0, min(n, self.size - offset))
        if len(self.buf) < n:
            self.buf.extend(bytes(n - len(self.buf)))
        got = 0
        with memoryview(self.buf) as mv:
            while got < n:
                with mv[got:n] as view:
                    k = os.preadv(self.fd, [view], offset + got)
                if k <= 0:  # shortened while read
                    break
                got += k
        self.skipped.read_bytes += got
        self.valid = got
        return got

    def forward(self, needle: bytes):
        """Where each occurrence of ``needle`` is in the buffer, first to last; the buffer holds the
        line after it whole (or the file's end, or over MAX_LINE bytes of it)."""
        k, off, chunk = len(needle), 0, _FIRST
        while off < self.size:
            got = self._read(off, chunk + MAX_LINE + 1)
            if not got:
                return
            limit = min(got, chunk + k - 1)  # hits starting in this chunk only
            i = self.buf.find(needle, 0, limit)
            while i >= 0:
                yield i
                i = self.buf.find(needle, i + 1, limit)
            off, chunk = off + chunk, min(2 * chunk, _CHUNK)

    def backward(self, needle: bytes):
        """Where each occurrence of ``needle`` is in the buffer, last to first."""
        k, hi, chunk = len(needle), self.size, _FIRST
        while hi > 0:
            lo = max(0, hi - chunk)
            got = self._read(lo, hi - lo + MAX_LINE + 1)
            if not got:
                return
            end = min(got, hi - lo + k - 1)
            i = self.buf.rfind(needle, 0, end)
            while i >= 0:
                yield i
                i = self.buf.rfind(needle, 0, i + k - 1)
            hi, chunk = lo, min(2 * chunk, _CHUNK)

    def _end(self, i: int) -> int:
        """Where the line after the newline at ``i`` ends: its newline, -1 torn, -2 over-long."""
        start = i + 1
        end = self.buf.find(b"\n", start, min(self.valid, start + MAX_LINE + 1))
        if end < 0:
            return -2 if self.valid - start > MAX_LINE else -1
        return end

    def line(self, i: int, check):
        """``check`` of the line after the newline at ``buf[i]``; None (counted unless torn) when bad."""
        end = self._end(i)
        if end == -2:
            self.skipped.line(f"longer than {MAX_LINE} bytes")
        if end < 0:
            return None  # -1: the last line, torn by a power cut (or shortened while read)
        try:
            return check(self.buf[i + 1:end])  # a copy: the buffer is read into again
        except Bad as exc:
            self.skipped.line(str(exc))
            return None

    def entries(self, needle: bytes = ENTRY_START, backwards: bool = False):
        for i in (self.backward if backwards else self.forward)(needle):
            e = self.line(i, entry)
            if e is not None:
                yield e

    def lineage(self, lid: str | None) -> dict | None:
        if not lid:
            return None
        assert self.side is not None  # the reader opens every segment with one
        other = _Segment(self.fd, self.size, self.path, self.skipped, self.side)  # same file, not closed by it
        for i in other.forward(LINEAGE_START + lid.encode("ascii") + b'"'):
            lin = other.line(i, lineage_record)
            if lin is not None:
                return lin
        return None

    def count(self, needle: bytes) -> int:
        """Lines starting with ``needle``, a torn last one left out (no parsing)."""
        k, n, off, chunk = len(needle), 0, 0, _CHUNK
        while off < self.size:
            got = self._read(off, chunk + k - 1)
            if not got:
                break
            n += self.buf.count(needle, 0, min(got, chunk + k - 1))
            off += chunk
        for i in self.backward(needle):  # the last one only
            if self._end(i) == -1:
                n -= 1
            break
        return n


class _Journal:
    """The journal's directory, opened once; its segments listed and opened relative to it."""

    def __init__(self, directory: str, skipped: Skipped | None) -> None:
        self.directory = directory
        self.skipped = Skipped() if skipped is None else skipped
        self.buf, self.side = bytearray(), bytearray()  # every segment's reads, one after the other
        try:
            self.fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            self.fd, self.segments = -1, []
            return
        try:
            self.segments = self._list()
        except BaseException:
            os.close(self.fd)
            raise

    def __enter__(self) -> _Journal:
        return self

    def __exit__(self, *exc) -> None:
        if self.fd >= 0:
            os.close(self.fd)

    def _list(self) -> list[tuple[int, str, int]]:
        """``(seq, name, size)`` of the regular files named like segments, oldest first."""
        out = []
        for name in os.listdir(self.fd):
            if not name.isascii():
                continue
            seq = segment_seq(name)
            if seq is None:
                continue
            try:
                st = check_mode(name, self.fd)
            except FileNotFoundError:  # deleted by the writer meanwhile
                continue
            except OSError as exc:  # Refused: a symlink, FIFO, directory, device, ...
                self.skipped.file(os.path.join(self.directory, name), str(exc) if isinstance(exc, Refused)
                                  else exc.strerror or str(exc))
                continue
            out.append((seq, name, st.st_size))
        out.sort()
        return out

    def open(self, name: str) -> _Segment | None:
        path = os.path.join(self.directory, name)
        try:
            fd, size = open_regular(name, self.fd, MAX_SEGMENT_BYTES)
        except FileNotFoundError:
            return None
        except Refused as exc:
            self.skipped.file(path, str(exc))
            return None
        return _Segment(fd, size, path, self.skipped, self.buf, self.side)

    def each(self, newest_first: bool = False):
        """Each segment that opens, oldest (or newest) first; closed after its turn."""
        for _, name, _ in (reversed(self.segments) if newest_first else self.segments):
            seg = self.open(name)
            if seg is None:
                continue
            try:
                yield seg
            finally:
                seg.close()


def find(directory: str, trace_id: str, skipped: Skipped | None = None) -> Found | None:
    """The entry of ``trace_id`` (16 lowercase hex digits), newest segment first; None if absent."""
    needle = ENTRY_START + trace_id.encode("ascii") + b'"'
    with _Journal(directory, skipped) as j:
        for seg in j.each(newest_first=True):
            for e in seg.entries(needle):
                if e["t"] == trace_id:
                    return Found(e, seg.lineage(e.get("l")), seg.path)
    return None


def last(directory: str, n: int, skipped: Skipped | None = None) -> list[tuple[dict, dict | None]]:
    """The ``n`` newest entries with their lineages, oldest of them first; bad lines do not count."""
    out: list = []
    with _Journal(directory, skipped) as j:
        for seg in j.each(newest_first=True):
            if len(out) >= n:
                break
            lineages: dict = {}
            for e in seg.entries(backwards=True):
                lid = e.get("l")
                if lid not in lineages:
                    lineages[lid] = seg.lineage(lid)
                out.append((e, lineages[lid]))
                if len(out) >= n:
                    break
    return out[::-1]


def extent(directory: str, count: bool = True, skipped: Skipped | None = None) -> dict:
    """How far back the journal reaches: segments, bytes, entries (with ``count``; reads every
    segment), the oldest and newest entries' times (epoch ms)."""
    with _Journal(directory, skipped) as j:
        segs = j.segments
        out = {"dir": directory, "segments": len(segs), "bytes": sum(s for _, _, s in segs), "entries": None,
               "oldest_ms": None, "newest_ms": None}
        for seg in j.each():
            first = next(seg.entries(), None)
            if first is not None:
                out["oldest_ms"] = first.get("ts")
                break
        for seg in j.each(newest_first=True):
            newest = next(seg.entries(backwards=True), None)
            if newest is not None:
                out["newest_ms"] = newest.get("ts")
                break
        if count:
            out["entries"] = sum(seg.count(ENTRY_START) for seg in j.each())
    return out
