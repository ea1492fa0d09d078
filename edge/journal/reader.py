"""Reading the journal: an entry by its trace id, the last entries, how far back it reaches.

Lookup maps each segment, newest first, and searches it for ``\\n{"t":"<trace id>"`` with
``mmap.find`` (C, at memory speed: see bench/journal_lookup.py for the figures). The needle
starts with a newline, so a hit is the start of a line, which the writer begins only with an
entry; the line must end with its newline and parse (a line torn by a power cut does not). The
entry's lineage is the segment's lineage record of the same id (``\\n{"L":"<id>"``), written
before the first entry that names it.

Segments may be deleted by a running writer while they are read: a segment that vanished
before it was opened is skipped, one already open stays readable (Linux keeps an unlinked
file until it is closed). Standard library only: ``edge trace`` must start fast.
"""

from __future__ import annotations

import json
import mmap
import os

from edge.journal.format import ENTRY_START, LINEAGE_START
from edge.journal.segments import list_segments

__all__ = ["find", "last", "extent", "Found"]

_CHUNK = 16 << 20  # bytes read at a time when counting entries


class Found:
    """An entry, the lineage it names, and the segment it is in."""

    __slots__ = ("entry", "lineage", "segment")

    def __init__(self, entry: dict, lineage: dict | None, segment: str) -> None:
        self.entry, self.lineage, self.segment = entry, lineage, segment


def _map(path: str) -> mmap.mmap | None:
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return None
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # the mapping outlives the descriptor
    except (FileNotFoundError, ValueError):
        return None


def _line_at(mm: mmap.mmap, start: int) -> dict | None:
    """The JSON object on the line starting at ``start`` (after its newline), or None when it is
    torn (no newline after it) or does not parse."""
    end = mm.find(b"\n", start)
    if end < 0:
        return None
    try:
        obj = json.loads(mm[start:end])
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _lineage(mm: mmap.mmap, lid: str | None) -> dict | None:
    if not lid:
        return None
    needle = LINEAGE_START + lid.encode() + b'"'
    i = mm.find(needle)
    while i >= 0:
        record = _line_at(mm, i + 1)
        if record and isinstance(record.get("lineage"), dict):
            return record["lineage"]
        i = mm.find(needle, i + 1)
    return None


def find(directory: str, trace_id: str) -> Found | None:
    """The entry of ``trace_id`` (16 lowercase hex digits), newest segment first; None if absent."""
    needle = ENTRY_START + trace_id.encode("ascii") + b'"'
    for _, path, _ in reversed(list_segments(directory)):
        mm = _map(path)
        if mm is None:
            continue
        try:
            i = mm.find(needle)
            while i >= 0:
                entry = _line_at(mm, i + 1)
                if entry is not None and entry.get("t") == trace_id:
                    return Found(entry, _lineage(mm, entry.get("l")), path)
                i = mm.find(needle, i + 1)
        finally:
            mm.close()
    return None


def _entries_backwards(mm: mmap.mmap):
    """Entries of one mapped segment, last first; a torn last line is skipped."""
    end = len(mm)
    while True:
        i = mm.rfind(ENTRY_START, 0, end)
        if i < 0:
            return
        entry = _line_at(mm, i + 1)
        if entry is not None and isinstance(entry.get("t"), str):
            yield entry
        end = i


def last(directory: str, n: int) -> list[tuple[dict, dict | None]]:
    """The ``n`` newest entries with their lineages, oldest of them first."""
    out: list = []
    for _, path, _ in reversed(list_segments(directory)):
        if len(out) >= n:
            break
        mm = _map(path)
        if mm is None:
            continue
        try:
            lineages: dict = {}
            for entry in _entries_backwards(mm):
                lid = entry.get("l")
                if lid not in lineages:
                    lineages[lid] = _lineage(mm, lid)
                out.append((entry, lineages[lid]))
                if len(out) >= n:
                    break
        finally:
            mm.close()
    return out[::-1]


def _first_entry(path: str) -> dict | None:
    mm = _map(path)
    if mm is None:
        return None
    try:
        i = mm.find(ENTRY_START)
        while i >= 0:
            entry = _line_at(mm, i + 1)
            if entry is not None:
                return entry
            i = mm.find(ENTRY_START, i + 1)
        return None
    finally:
        mm.close()


def _count(path: str) -> int:
    """Entry lines of a segment (read in chunks; a needle across two chunks counted once), a
    torn last line left out."""
    n, keep = 0, len(ENTRY_START) - 1
    try:
        with open(path, "rb") as f:
            tail = b""
            while chunk := f.read(_CHUNK):
                data = tail + chunk
                n += data.count(ENTRY_START)
                tail = data[-keep:]  # shorter than the needle: it cannot hold one already counted
    except FileNotFoundError:
        return n
    mm = _map(path)
    if mm is not None:
        i = mm.rfind(ENTRY_START)
        if i >= 0 and mm.find(b"\n", i + 1) < 0:
            n -= 1
        mm.close()
    return n


def extent(directory: str, count: bool = True) -> dict:
    """How far back the journal reaches: segments, bytes, entries (with ``count``; reads every
    segment), the oldest and newest entries' times (epoch ms)."""
    segs = list_segments(directory)
    out = {"dir": directory, "segments": len(segs), "bytes": sum(s for _, _, s in segs), "entries": None,
           "oldest_ms": None, "newest_ms": None}
    for _, path, _ in segs:
        first = _first_entry(path)
        if first is not None:
            out["oldest_ms"] = first.get("ts")
            break
    for _, path, _ in reversed(segs):
        mm = _map(path)
        if mm is None:
            continue
        try:
            newest = next(_entries_backwards(mm), None)
        finally:
            mm.close()
        if newest is not None:
            out["newest_ms"] = newest.get("ts")
            break
    if count:
        out["entries"] = sum(_count(path) for _, path, _ in segs)
    return out
