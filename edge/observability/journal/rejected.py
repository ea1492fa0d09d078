"""Payloads of rejected requests, kept for inspection (``edge serve --keep-rejected N``).

A request refused as invalid (a 1xxx code: malformed frames, unknown type, bad fields, empty
or overlong text, ...) is kept as ``<trace_id>.bin`` (its frames after the routing envelope,
concatenated, at most :data:`SAMPLE_BYTES` in all) and ``<trace_id>.json`` (sizes, code, time),
both 0600 in a 0700 directory: a payload is a client's text, readable by the runtime's user
alone. Written by the journal's writer thread, never the I/O thread, which only copies the
first 4 KiB of a request's frames when N > 0 (see :func:`capture`).

Two bounds, the oldest sample deleted first: at most N samples, and the journal's cap in bytes
(:class:`edge.observability.journal.budget.ByteCap`), which counts the samples with the segment files. A
sample counts as what it takes on disk: each of its two files rounded up to the file system's
block. An over-long text's sample is a 4,096-byte ``.bin`` and a ~400-byte ``.json``: 4.4 KiB
of bytes, but 8 KiB on 4 KiB blocks (ext4, tmpfs), as ``tests/journal/test_journal_space.py``
measures from ``st_blocks``. A failed write removes what it left, so a sample is on disk whole
or not at all.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque

from edge.observability.journal.budget import FOUND, ByteCap, round_up

__all__ = ["SAMPLE_BYTES", "SAMPLE_DISK_BYTES", "BLOCK_BYTES", "MAX_FRAMES", "capture", "RejectedStore",
           "read_sample"]

SAMPLE_BYTES = 4096  # payload bytes kept per sample, over all its frames
BLOCK_BYTES = 4096  # a file's allocation unit when statvfs cannot say (bytes)
SAMPLE_DISK_BYTES = 2 * BLOCK_BYTES  # a sample of a 4 KiB payload on 4 KiB blocks: .bin + .json (bytes)
MAX_FRAMES = 16  # frames whose sizes a sample records (a request of 1,000 frames is refused anyway)
_META, _BIN = ".json", ".bin"


def capture(frames: list, budget: int = SAMPLE_BYTES) -> tuple[list, list]:
    """(sizes, kept bytes) of the first frames: what the I/O thread holds until the reply."""
    sizes, kept = [], []
    for f in frames[:MAX_FRAMES]:
        n = len(f)
        sizes.append(n)
        take = min(n, budget)
        if take:
            kept.append(f[:take] if isinstance(f, bytes) else f.buffer[:take].tobytes())  # bytes, or a zmq.Frame
            budget -= take
        else:
            kept.append(b"")
    return sizes, kept


def _open_private(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def _write_new(path: str, data: bytes, mtime_ns: int | None = None) -> None:
    """A new private file holding ``data``; on OSError (ENOSPC mid-write) nothing of it is left."""
    fd = _open_private(path)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if mtime_ns is not None:
            os.utime(fd, ns=(mtime_ns, mtime_ns))
    except OSError:
        os.close(fd)
        _unlink(path)
        raise
    os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class RejectedStore:
    """The samples directory; owned by the journal's writer thread. ``cap``: the journal's cap,
    which counts the samples with the segments (None: only the count ``keep`` bounds them)."""

    def __init__(self, directory: str, keep: int, cap: ByteCap | None = None) -> None:
        self.directory = directory
        self.keep = keep
        self.cap = cap
        if cap is not None:
            cap.add(self)
        self.written = 0
        self.too_large = 0  # samples the cap could not hold (a cap smaller than a sample)
        self.on_disk = 0  # bytes of the samples kept, each file rounded up to a block
        self.pinned = 0  # every sample may be deleted (ByteCap)
        self.block = BLOCK_BYTES
        self.opened = False
        self._last_ns = 0  # the newest sample's mtime (ns): the next one's is later (see add)
        self._ids: deque = deque()  # trace ids kept, oldest first
        self._kept: dict[str, tuple] = {}  # trace id -> (stamp, bytes on disk)

    def open(self) -> None:
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        os.chmod(self.directory, 0o700)  # an existing directory too: payloads are private
        try:
            self.block = os.statvfs(self.directory).f_frsize or BLOCK_BYTES
        except OSError:
            pass
        names = set(os.listdir(self.directory))
        found = []
        for name in names:
            if name.endswith(_BIN) and name[:-len(_BIN)] + _META not in names:
                _unlink(os.path.join(self.directory, name))  # cut short by a crash between the two files
            elif name.endswith(_META):
                tid = name[:-len(_META)]
                base = os.path.join(self.directory, tid)
                try:
                    st = os.stat(base + _META)
                    payload = os.stat(base + _BIN).st_size if tid + _BIN in names else 0
                except FileNotFoundError:
                    continue
                found.append((st.st_mtime_ns, tid, self._cost(payload, st.st_size)))
        for mtime, tid, cost in sorted(found):
            self._keep_id(tid, (FOUND, mtime), cost)
            self._last_ns = mtime
        self._trim(self.keep)
        self.opened = True

    @property
    def count(self) -> int:
        return len(self._ids)

    def _cost(self, payload: int, meta: int) -> int:
        return round_up(payload, self.block) + round_up(meta, self.block)

    def _keep_id(self, trace_id: str, stamp, cost: int) -> None:
        self._ids.append(trace_id)
        self._kept[trace_id] = (stamp, cost)
        self.on_disk += cost

    def add(self, trace_id: str, meta: dict, sample: tuple[list, list]) -> None:
        """Write one sample, deleting the oldest ones (by count, then by the cap) first. Raises
        OSError (nothing of the sample is left) and :class:`edge.observability.journal.budget.CapFull`."""
        sizes, kept = sample
        base = os.path.join(self.directory, trace_id)
        self._drop(trace_id)  # a trace id seen again (never, in practice): the new sample wins
        frames = [{"size": n, "kept": len(k), "truncated": len(k) < n} for n, k in zip(sizes, kept)]
        meta = {**meta, "trace_id": trace_id, "frames": frames, "frames_total": len(sizes),
                "truncated": any(f["truncated"] for f in frames)}
        payload = b"".join(kept)
        text = json.dumps(meta, separators=(",", ":"), default=str).encode()
        cost = self._cost(len(payload), len(text))
        self._trim(self.keep - 1)
        if self.cap is not None:
            self.cap.make_room(cost)
        # The .json's mtime orders the samples a restart finds: strictly increasing, since the
        # kernel's file times are coarse (~4 ms: ten samples written in a row would tie) and a
        # device without a real-time clock may boot with its clock behind the last run's.
        self._last_ns = max(time.time_ns(), self._last_ns + 1)
        _write_new(base + _BIN, payload)
        try:
            _write_new(base + _META, text, self._last_ns)
        except OSError:
            _unlink(base + _BIN)
            raise
        self._keep_id(trace_id, self.cap.stamp() if self.cap is not None else (1, self.written), cost)
        self.written += 1

    # ByteCap's side: the oldest sample, and deleting it

    def oldest_stamp(self):
        return self._kept[self._ids[0]][0] if self._ids else None

    def drop_oldest(self) -> int:
        return self._remove(self._ids.popleft())

    def _trim(self, keep: int) -> None:
        while len(self._ids) > max(keep, 0):
            self._remove(self._ids.popleft())

    def _drop(self, trace_id: str) -> None:
        if trace_id in self._kept:
            self._ids.remove(trace_id)
            self._remove(trace_id)

    def _remove(self, trace_id: str) -> int:
        _, cost = self._kept.pop(trace_id)
        for ext in (_META, _BIN):  # the meta first: a sample without it is not listed
            _unlink(os.path.join(self.directory, trace_id + ext))
        self.on_disk -= cost
        return cost


def read_sample(directory: str, trace_id: str) -> dict | None:
    """The sample kept for ``trace_id``: its metadata, each frame's kept bytes (``data``), or None."""
    base = os.path.join(directory, trace_id)
    try:
        with open(base + _META) as f:
            meta = json.load(f)
        with open(base + _BIN, "rb") as f:
            data = f.read()
    except (OSError, ValueError):
        return None
    offset = 0
    for frame in meta.get("frames") or []:
        n = int(frame.get("kept") or 0)
        frame["data"] = data[offset:offset + n]
        offset += n
    return meta
