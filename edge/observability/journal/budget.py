"""One cap in bytes over everything the journal keeps on disk: its segment files and the rejected
samples (docs/trace.md, "The cap").

Two holders share a :class:`ByteCap`: :class:`edge.observability.journal.segments.SegmentFiles` and
:class:`edge.observability.journal.rejected.RejectedStore`. Before either writes ``n`` bytes it asks the cap
for room; the cap deletes the oldest item of either holder (a closed segment or a sample) until
the bytes of both plus ``n`` fit. So what is on disk never exceeds the cap, and a burst of
refused requests can take the space of old entries but never more than the cap.

Oldest is ordered by a stamp each item gets when it is written: this run's items are stamped by
a counter (the wall clock of a device without a real-time clock can jump back at boot), items
found on disk at start by their ``mtime`` and ranked before all of this run's.

Owned by the journal's writer thread, as its holders are. Standard library only.
"""

from __future__ import annotations

import itertools

__all__ = ["ByteCap", "CapFull", "FOUND", "round_up"]

FOUND = 0  # stamp rank of an item an earlier run left: older than anything this run writes
_THIS_RUN = 1


class CapFull(ValueError):
    """``n`` bytes do not fit under the cap even with every deletable item deleted."""


def round_up(n: int, block: int) -> int:
    """Bytes a file of ``n`` bytes takes on a file system of ``block``-byte blocks."""
    return -(-n // block) * block


class ByteCap:
    """The cap; each holder has ``on_disk`` (bytes), ``pinned`` (those of them that cannot be
    deleted now: the segment being written), ``oldest_stamp()`` (None when it holds nothing
    deletable) and ``drop_oldest()`` (deletes that item, returns its bytes)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.holders: list = []
        self._counter = itertools.count()

    def add(self, holder) -> None:
        self.holders.append(holder)

    def stamp(self) -> tuple[int, int]:
        """The stamp of an item written now: after every earlier one."""
        return (_THIS_RUN, next(self._counter))

    @property
    def used(self) -> int:
        return sum(h.on_disk for h in self.holders)

    def make_room(self, n: int) -> None:
        """Delete the oldest items until ``n`` more bytes fit; CapFull when they cannot. An
        OSError of a deletion (other than a file already gone) reaches the caller."""
        if n + sum(h.pinned for h in self.holders) > self.max_bytes:  # deleting everything would not do
            raise CapFull(f"cap of {self.max_bytes} bytes cannot hold {n} more bytes")
        while self.used + n > self.max_bytes:
            best, best_stamp = None, None
            for h in self.holders:
                s = h.oldest_stamp()
                if s is not None and (best_stamp is None or s < best_stamp):
                    best, best_stamp = h, s
            if best is None:
                raise CapFull(f"cap of {self.max_bytes} bytes cannot hold {n} more bytes "
                              f"({self.used} held that cannot be deleted)")
            best.drop_oldest()
