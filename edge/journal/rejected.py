"""Payloads of rejected requests, kept for inspection (``edge serve --keep-rejected N``).

A request refused as invalid (a 1xxx code: malformed frames, unknown type, bad fields, empty
or overlong text, ...) is kept as ``<trace_id>.bin`` (its frames after the routing envelope,
concatenated, at most :data:`SAMPLE_BYTES` in all) and ``<trace_id>.json`` (sizes, code, time),
both 0600 in a 0700 directory: a payload is a client's text, readable by the runtime's user
alone. At most N samples are kept, the oldest deleted first, so the directory holds at most
N x (4 KiB + ~1 KiB). Written by the journal's writer thread, never the I/O thread, which only
copies the first 4 KiB of a request's frames when N > 0 (see :func:`capture`).
"""

from __future__ import annotations

import json
import os
from collections import deque

__all__ = ["SAMPLE_BYTES", "MAX_FRAMES", "capture", "RejectedStore", "read_sample"]

SAMPLE_BYTES = 4096  # payload bytes kept per sample, over all its frames
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


class RejectedStore:
    """The samples directory; owned by the journal's writer thread."""

    def __init__(self, directory: str, keep: int) -> None:
        self.directory = directory
        self.keep = keep
        self.written = 0
        self._ids: deque = deque()  # trace ids kept, oldest first

    def open(self) -> None:
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        os.chmod(self.directory, 0o700)  # an existing directory too: payloads are private
        found = []
        for name in os.listdir(self.directory):
            if name.endswith(_META):
                try:
                    found.append((os.stat(os.path.join(self.directory, name)).st_mtime_ns, name[:-len(_META)]))
                except FileNotFoundError:
                    continue
        self._ids.extend(tid for _, tid in sorted(found))
        self._trim()

    @property
    def count(self) -> int:
        return len(self._ids)

    def add(self, trace_id: str, meta: dict, sample: tuple[list, list]) -> None:
        sizes, kept = sample
        base = os.path.join(self.directory, trace_id)
        self._drop(trace_id)  # a trace id seen again (never, in practice): the new sample wins
        frames = [{"size": n, "kept": len(k), "truncated": len(k) < n} for n, k in zip(sizes, kept)]
        meta = {**meta, "trace_id": trace_id, "frames": frames, "frames_total": len(sizes),
                "truncated": any(f["truncated"] for f in frames)}
        fd = _open_private(base + _BIN)
        with os.fdopen(fd, "wb") as f:
            f.write(b"".join(kept))
        fd = _open_private(base + _META)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(meta, separators=(",", ":"), default=str))
        self._ids.append(trace_id)
        self.written += 1
        self._trim()

    def _trim(self) -> None:
        while len(self._ids) > self.keep:
            self._remove(self._ids.popleft())

    def _drop(self, trace_id: str) -> None:
        if trace_id in self._ids:
            self._ids.remove(trace_id)
            self._remove(trace_id)

    def _remove(self, trace_id: str) -> None:
        for ext in (_META, _BIN):  # the meta first: a sample without it is not listed
            try:
                os.unlink(os.path.join(self.directory, trace_id + ext))
            except FileNotFoundError:
                pass


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
