"""The journal's two halves: :meth:`Journal.note`, which the I/O thread calls once per reply, and
the writer thread, which encodes and writes what it noted (docs/trace.md).

The I/O thread sends every reply; the journal must never slow it nor make it wait. So ``note``
only reads a few fields into a tuple and appends it to a deque, bounded at
:data:`QUEUE_MAX` entries: when the writer falls that far behind, the entry is dropped and
counted (``stats``: ``journal.dropped_by_reason.queue_full``), never waited for. The writer thread
wakes when the deque stops being empty (or every ``flush_s``), encodes the entries, appends
them to the segment files (``edge/observability/journal/segments.py``) and writes rejected samples
(``edge/observability/journal/rejected.py``), both under one cap in bytes (``edge/observability/journal/budget.py``). It
yields the GIL every :data:`YIELD_EVERY` entries, so a burst of entries delays the I/O thread
by well under a millisecond at a time.

A write error never fails a request. Lack of space (ENOSPC, EDQUOT: a full disk, a quota)
pauses that half (entries or samples): what it loses is counted (``no_space``), never as
written, and :data:`RETRY_S` later the next entry tries again, the wait doubling per failed try
up to :data:`RETRY_MAX_S`; the first write that reaches the kernel resumes it. It is logged
once per pause (``journal.paused``, ``journal.resumed``). Any other error (read-only file
system, permissions, another runtime's lock) is counted, logged once (``journal.disabled``),
and that half is off from then on.

Threads and owners: ``dropped`` is the I/O thread's; every other counter is the writer's;
``info()`` reads them all (integers, under the GIL).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections import deque
from typing import Any

from edge.observability.journal.budget import ByteCap, CapFull
from edge.observability.journal.format import entry_line, lineage_id
from edge.observability.journal.rejected import SAMPLE_BYTES, RejectedStore
from edge.observability.journal.segments import JournalLocked, SegmentFiles

__all__ = ["Journal", "open_journal", "QUEUE_MAX", "YIELD_EVERY", "NO_SPACE", "RETRY_S", "RETRY_MAX_S"]

# Entries waiting for the writer. ~300 bytes each with their lists (most shared with the request
# record): 64K entries are ~20 MB at worst, and ~10 s of a Jetson's saturation rate.
QUEUE_MAX = 65536
YIELD_EVERY = 64  # entries encoded between two yields of the GIL (~0.3 ms of work)
FLUSH_S = 1.0  # the buffer goes to the kernel at least this often (s)
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})  # errors that pause writing instead of ending it
# After a write failed for lack of space, the next try waits this long (s), doubling per failed
# try up to RETRY_MAX_S: one failed write per wait, never one per entry, and space that comes
# back is used within ~8 s.
RETRY_S = 1.0
RETRY_MAX_S = 8.0
PARTS = ("journal", "rejected")  # the two halves: entries, samples


class Journal:
    def __init__(self, directory: str | None, max_bytes: int, lineage: dict, *, rejected_dir: str | None = None,
                 keep_rejected: int = 0, queue_max: int = QUEUE_MAX, flush_s: float = FLUSH_S,
                 segment_bytes: int | None = None, explicit: bool = True, fallback_lineage: dict | None = None,
                 retry_s: float = RETRY_S, retry_max_s: float = RETRY_MAX_S) -> None:
        self.directory = directory if directory and max_bytes else None
        self.max_bytes = max_bytes
        self.lineage = dict(lineage)
        self.lid = lineage_id(self.lineage)
        # A degraded reply (the breaker's fallback served it) names the fallback's lineage.
        self.fallback_lineage = dict(fallback_lineage) if fallback_lineage else None
        self.fallback_lid = lineage_id(self.fallback_lineage) if self.fallback_lineage else None
        # One cap over the segments and the samples (both its holders): --journal-max-bytes.
        self.cap = ByteCap(max_bytes) if max_bytes > 0 else None
        self.segments = SegmentFiles(self.directory, max_bytes, segment_bytes, self.cap) if self.directory else None
        self.rejected = (RejectedStore(rejected_dir, keep_rejected, self.cap)
                         if rejected_dir and keep_rejected > 0 else None)
        # What the I/O thread copies from each message for a sample (bytes; 0: nothing).
        self.sample_bytes = SAMPLE_BYTES if self.rejected is not None else 0
        self.queue_max = queue_max
        self.flush_s = flush_s
        self.retry_s, self.retry_max_s = retry_s, retry_max_s
        self.enabled = self.segments is not None  # entries are written (False after a write error)
        self.samples_enabled = self.rejected is not None
        self.dropped = {"queue_full": 0, "disabled": 0}  # I/O thread
        self.lost = {"no_space": 0, "disabled": 0}  # entries queued or buffered when a write failed: writer thread
        self.too_large = 0
        self.samples_lost = 0  # samples not written: a write failed, or taken while paused
        self.write_errors = 0
        self.errors: dict[str, str] = {}  # "journal" | "rejected" -> the error that turned it off
        self.pauses = {p: 0 for p in PARTS}  # times a part paused for lack of space
        self._retry_at = {p: 0.0 for p in PARTS}  # monotonic s of its next try; 0: writing
        self._wait_s = {p: 0.0 for p in PARTS}  # the wait before that try (s)
        self._pause_mark = {p: (0.0, 0) for p in PARTS}  # (monotonic start, lost count) of the pause
        self._seg_lost = 0  # segments.entries_lost already put in self.lost
        self._flushed_mark = 0  # segments.entries_flushed when writing paused
        # False: the journal's directory is the default one, nobody asked for it; its failure (a
        # bundle's read-only root, another runtime's lock) is a warning, not an error.
        self.explicit = explicit
        self._pid = os.getpid()
        self.lock_wait_s = 0.0  # how long the writer waits for another runtime's lock (boot sets it)
        self._q: deque = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._opened = False
        self._thread: threading.Thread | None = None

    @property
    def written(self) -> int:
        """Entries whose bytes reached the kernel (not those still buffered, nor lost)."""
        return self.segments.entries_flushed if self.segments is not None else 0

    def paused(self, part: str = "journal") -> bool:
        """True from a write that failed for lack of space until one succeeds again."""
        return self._retry_at[part] > 0

    # ------------------------------------------------------------ I/O thread

    def note(self, kind: str, peer: Any, code: int = 0, message: str | None = None, request_id: Any = None,
             request: Any = None, drop: str | None = None) -> None:
        """One reply, sent (``drop`` None) or not (``drop``: why). Appends a tuple; never blocks."""
        sample = getattr(peer, "sample", None) if 1000 <= code < 2000 else None  # 1xxx: refused as invalid
        if not self.enabled and (sample is None or not self.samples_enabled):
            self.dropped["disabled"] += 1
            return
        q = self._q
        if len(q) >= self.queue_max:
            self.dropped["queue_full"] += 1
            return
        r = None
        if request is not None:
            r = (request.n_texts, request.tokens, request.buckets, request.truncated, request.enqueued, request.done,
                 request.compute_ms, request.batches, request.degraded)
        was_empty = not q
        q.append((kind, peer.trace_id, peer.received, time.monotonic(), peer.identity, peer.conn, peer.address,
                  request_id, int(code), message, drop, r, sample))
        if was_empty:  # the writer drains until empty; a wake-up while it works would be wasted
            self._wake.set()

    # ------------------------------------------------------------ lifecycle

    def start(self) -> "Journal":
        """Start the writer thread (after READY: it creates the directories and lists segments)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="edge-journal", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> bool:
        """Write what is queued, flush and close; True when done within ``timeout_s``. Without a
        started thread, the caller's thread does it."""
        self._stopping = True
        self._wake.set()
        if self._thread is None:
            self._run()
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def info(self) -> dict:
        """The ``journal`` block of ``stats`` (and the edge_journal_* metrics)."""
        seg, cap, now = self.segments, self.cap, time.monotonic()
        dropped = {"queue_full": self.dropped["queue_full"],
                   "disabled": self.dropped["disabled"] + self.lost["disabled"],
                   "too_large": self.too_large, "no_space": self.lost["no_space"]}
        out: dict[str, Any] = {
            "enabled": self.enabled, "paused": self.paused("journal"), "pauses": self.pauses["journal"],
            "retry_in_s": self._retry_in(now, "journal"), "dir": self.directory,
            "max_bytes": cap.max_bytes if cap else 0, "used_bytes": cap.used if cap else 0,
            "entries_written": self.written, "entries_buffered": seg.buffered_entries if seg else 0,
            "entries_dropped": sum(dropped.values()), "dropped_by_reason": dropped,
            "bytes": seg.on_disk if seg else 0, "segments": seg.count if seg else 0,
            "segments_created": seg.segments_created if seg else 0, "write_errors": self.write_errors,
            "queued": len(self._q), "queue_max": self.queue_max, "errors": dict(self.errors),
        }
        r = self.rejected
        out["rejected"] = {"enabled": self.samples_enabled, "paused": self.paused("rejected"),
                           "pauses": self.pauses["rejected"], "dir": r.directory if r else None,
                           "keep": r.keep if r else 0, "kept": r.count if r else 0, "bytes": r.on_disk if r else 0,
                           "written": r.written if r else 0, "lost": self.samples_lost,
                           "too_large": r.too_large if r else 0}
        return out

    def _retry_in(self, now: float, part: str) -> float | None:
        at = self._retry_at[part]
        return round(max(at - now, 0.0), 3) if at else None

    # ------------------------------------------------------------ writer thread

    def _run(self) -> None:
        if not self._opened:
            self._opened = True
            self._open()
        last_flush = time.monotonic()
        while True:
            if not self._stopping:
                self._wake.wait(self.flush_s)
            self._wake.clear()
            self._drain()
            now = time.monotonic()
            if self._stopping or now - last_flush >= self.flush_s:
                self._flush()
                last_flush = now
            if self._stopping and not self._q:
                break
        if self.segments is not None and self.segments.opened:
            try:
                self.segments.close()
            except OSError as exc:
                self._write_error("journal", exc)

    def _open(self) -> None:
        if self.segments is not None:
            try:
                self._open_segments()
            except OSError as exc:
                self._write_error("journal", exc)
        if self.rejected is not None:
            try:
                self.rejected.open()
            except OSError as exc:
                self._write_error("rejected", exc)
        if self.cap is not None:  # what earlier runs left, under a smaller cap: the oldest go now
            try:
                self.cap.make_room(0)
            except (OSError, ValueError):
                pass  # a deletion failed: the next write tries again, and reports it

    def _open_segments(self) -> None:
        """Open the segments; while another runtime holds their lock, try again for ``lock_wait_s``
        (a runtime restored beside the one it replaces: that one writes until it has drained).
        Replies noted meanwhile wait in the queue, within its bound."""
        assert self.segments is not None
        give_up = time.monotonic() + self.lock_wait_s
        while True:
            try:
                self.segments.open()
                return
            except JournalLocked:
                if self._stopping or time.monotonic() >= give_up:
                    raise
                time.sleep(0.05)

    def _drain(self) -> None:
        q = self._q
        offset = time.time() - time.monotonic()  # dates the monotonic stamps
        now = time.monotonic()
        n = 0
        while q:
            item = q.popleft()
            if self.enabled:
                if self._retry_at["journal"] > now:  # paused: no space (a try waits for its time)
                    self.lost["no_space"] += 1
                else:
                    self._write(item, offset)
            elif self.segments is not None:  # queued before a write error turned the journal off
                self.lost["disabled"] += 1
            if item[12] is not None and self.samples_enabled:
                if self._retry_at["rejected"] > now:
                    self.samples_lost += 1
                else:
                    self._sample(item, offset)
            n += 1
            if n % YIELD_EVERY == 0:
                time.sleep(0)  # let the I/O thread take the GIL now, not at the end of the switch interval
                now = time.monotonic()

    def _write(self, item: tuple, offset: float) -> None:
        seg = self.segments
        assert seg is not None  # called only while enabled, which needs the segments
        try:
            if not seg.opened:  # its open failed for lack of space: a try
                seg.open()
            lid, lineage = self.lid, self.lineage
            # Degraded: the fallback served it. Its lid and lineage are set together (both or neither).
            if (item[11] is not None and item[11][8] and self.fallback_lid is not None
                    and self.fallback_lineage is not None):
                lid, lineage = self.fallback_lid, self.fallback_lineage
            seg.append(entry_line(item, offset, lid), lid, lineage, self._pid)
        except ValueError:  # an entry larger than a quarter of a segment (a tiny cap)
            self.too_large += 1
        except OSError as exc:
            self._write_error("journal", exc)

    def _sample(self, item: tuple, offset: float) -> None:
        kind, trace_id, received, _, identity, conn, address, request_id, code, message = item[:10]
        from edge.errors import ErrorCode

        meta = {"time_ms": int((received + offset) * 1000), "type": kind, "code": code,
                "name": ErrorCode(code).name if code in ErrorCode._value2member_map_ else str(code),
                "message": (message or "")[:200], "request_id": request_id,
                "client": {"identity": identity[:64].hex(), "connection": conn, "peer": address}}
        r = self.rejected
        assert r is not None  # called only while samples_enabled, which needs the store
        try:
            if not r.opened:
                r.open()
            r.add(trace_id, meta, item[12])
        except CapFull:  # a cap smaller than one sample (and the segment being written)
            r.too_large += 1
        except OSError as exc:
            self.samples_lost += 1
            self._write_error("rejected", exc)
        else:
            if self._retry_at["rejected"]:
                self._resume("rejected")

    def _flush(self) -> None:
        seg = self.segments
        if not (self.enabled and seg is not None and seg.opened) or self._retry_at["journal"] > time.monotonic():
            return
        try:
            seg.flush()
        except OSError as exc:
            self._write_error("journal", exc)
            return
        if self._retry_at["journal"] and seg.entries_flushed > self._flushed_mark:
            self._resume("journal")

    # ------------------------------------------------------------ write errors

    def _write_error(self, part: str, exc: OSError) -> None:
        """Count a failed write and the entries it lost; pause ``part`` (no space) or turn it off."""
        self.write_errors += 1
        space = exc.errno in NO_SPACE
        seg = self.segments
        if part == "journal" and seg is not None:  # the buffer it lost (segments.py counts it)
            self.lost["no_space" if space else "disabled"] += seg.entries_lost - self._seg_lost
            self._seg_lost = seg.entries_lost
        if space:
            self._pause(part, exc)
        else:
            self._fail(part, exc)

    def _lost_count(self, part: str) -> int:
        return self.lost["no_space"] if part == "journal" else self.samples_lost

    def _pause(self, part: str, exc: OSError) -> None:
        """No space: stop writing ``part`` until a try after the wait; log the first failure only."""
        now = time.monotonic()
        first = not self._retry_at[part]
        self._wait_s[part] = self.retry_s if first else min(self._wait_s[part] * 2, self.retry_max_s)
        self._retry_at[part] = now + self._wait_s[part]
        if part == "journal" and self.segments is not None:
            self._flushed_mark = self.segments.entries_flushed
        if not first:
            return
        self.pauses[part] += 1
        self._pause_mark[part] = (now, self._lost_count(part))
        from edge.system.log import log

        log("journal.paused", level="warning", part=part, dir=self._dir(part),
            error=f"{type(exc).__name__}: {exc}"[:300], retry_s=self._wait_s[part],
            advice="requests are served; what it cannot write is counted (stats journal.dropped_by_reason.no_space, "
                   "journal.rejected.lost) and writing resumes by itself once there is space: free some, or lower "
                   "--journal-max-bytes below what the file system can spare")

    def _resume(self, part: str) -> None:
        since, lost_before = self._pause_mark[part]
        self._retry_at[part], self._wait_s[part] = 0.0, 0.0
        from edge.system.log import log

        log("journal.resumed", part=part, dir=self._dir(part), paused_s=round(time.monotonic() - since, 3),
            lost=self._lost_count(part) - lost_before)

    def _dir(self, part: str) -> str | None:
        return self.directory if part == "journal" else getattr(self.rejected, "directory", None)

    def _fail(self, part: str, exc: BaseException) -> None:
        """Turn ``part`` off for good, counted and logged once: a request never fails for it."""
        if part == "journal":
            self.enabled = False
        else:
            self.samples_enabled = False
        self._retry_at[part] = 0.0
        if part in self.errors:
            return
        self.errors[part] = f"{type(exc).__name__}: {exc}"[:300]
        from edge.system.log import log

        level = "error" if self.explicit or part == "rejected" else "warning"
        log("journal.disabled", level=level, part=part, dir=self._dir(part), error=self.errors[part],
            advice="requests are served without it; fix the directory (permissions, a writable mount) "
                   "and restart, or set --journal-dir off / --keep-rejected 0")


def open_journal(args: Any, lineage: dict, fallback_lineage: dict | None = None) -> Journal | None:
    """The journal ``edge serve``'s arguments ask for (not started), or None when they ask for
    neither entries nor samples."""
    from edge.observability.journal.options import journal_dir, rejected_dir, state_dir

    max_bytes = int(getattr(args, "journal_max_bytes", 0) or 0)
    keep = int(getattr(args, "keep_rejected", 0) or 0)
    given_state, given_dir = getattr(args, "state_dir", None), getattr(args, "journal_dir", None)
    state = state_dir(given_state)
    directory = journal_dir(given_dir, state) if max_bytes else None
    if directory is None and not keep:
        return None
    return Journal(directory, max_bytes, lineage, rejected_dir=rejected_dir(state) if keep else None,
                   keep_rejected=keep, explicit=bool(given_state or given_dir), fallback_lineage=fallback_lineage)
