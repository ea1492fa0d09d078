"""Length-bucketed batch scheduler.

Pure data structure, no threads and no clock of its own: the engine loop owns
it, passes ``now`` (``time.monotonic()`` seconds) into every call, and is the
only caller. That makes the policy testable with a fake clock.

Policy (DESIGN.md "Scheduling"):

- Each text of a request is a :class:`Part`, queued in the smallest bucket that
  holds its tokens. A request (:class:`Job`) may span several buckets.
- A bucket is *ready* when it is full (``cap`` parts, where ``cap`` is
  max_batch_size bounded by max_batch_tokens // bucket and by the buffer rows),
  when its oldest part has waited ``max_delay_ms``, or when a part of it arrived
  while the engine was idle, i.e. after the last batch had ended (a lone request
  on a quiet device is not delayed; parts that arrive while a batch runs wait
  up to max_delay_ms to fill the next one).
- Among ready buckets the one holding the earliest effective deadline runs
  first (a request without a deadline gets arrival + ``default_deadline_ms``),
  so no bucket starves.
- Inside the chosen bucket, parts go by (priority, effective deadline, arrival):
  priority 0 first.
- Expired jobs (deadline passed before their parts ran) and dropped jobs
  (cancelled, failed) leave the queues before anything runs.
"""

from __future__ import annotations

import bisect
import math
from typing import Any, Iterable

import numpy as np

__all__ = ["Part", "Job", "BucketScheduler"]


class Part:
    """One text of a job: its token ids and the bucket they were queued in."""

    __slots__ = ("job", "index", "ids", "bucket", "queued")

    def __init__(self, job: "Job", index: int, ids: np.ndarray, bucket: int) -> None:
        self.job = job
        self.index = index  # position of the text in the request
        self.ids = ids  # (n,) int64, with special tokens, n <= bucket
        self.bucket = bucket  # tokens
        self.queued = False

    @property
    def arrival(self) -> float:
        return self.job.arrival


class Job:
    """A request in flight: its parts, timing and the outputs gathered so far.

    ``ctx`` is opaque to the scheduler (the server keeps the reply address there).
    """

    __slots__ = (
        "parts", "arrival", "deadline", "eff_deadline", "priority", "seq", "done",
        "remaining", "out", "queue_ms", "compute_ms", "last_batch", "ctx", "idle_arrival",
    )

    def __init__(
        self,
        ids: Iterable[np.ndarray],
        buckets: Iterable[int],
        arrival: float,
        *,
        deadline: float | None = None,
        priority: int = 1,
        ctx: Any = None,
    ) -> None:
        self.parts = [Part(self, i, a, b) for i, (a, b) in enumerate(zip(ids, buckets))]
        self.arrival = arrival  # monotonic s, stamped on arrival at the socket
        self.deadline = deadline  # monotonic s, or None
        self.eff_deadline = math.inf  # set by the scheduler on add
        self.priority = priority  # 0 first .. 2 last
        self.seq = 0
        self.done = False  # answered (result or error); remaining parts are ignored
        self.remaining = len(self.parts)
        self.out: np.ndarray | None = None  # (N, D) float32, allocated by the engine loop
        self.queue_ms = 0.0  # longest wait of any part before its batch ran (ms)
        self.compute_ms = 0.0  # sum of the engine times of the batches it was in (ms)
        self.last_batch = -1
        self.ctx = ctx
        self.idle_arrival = False  # arrived when no batch was running: dispatch at once


class BucketScheduler:
    def __init__(
        self,
        buckets: Iterable[int],
        max_batch_size: int = 32,
        max_batch_tokens: int = 8192,
        max_delay_ms: float = 2.0,
        *,
        default_deadline_ms: float = 30_000.0,
        rows: dict[int, int] | None = None,
    ) -> None:
        self.buckets = sorted({int(b) for b in buckets})
        if not self.buckets or self.buckets[0] <= 0:
            raise ValueError(f"buckets must be positive token counts, got {self.buckets}")
        self.max_delay = max_delay_ms / 1000.0  # s
        self.default_deadline = default_deadline_ms / 1000.0  # s
        rows = rows or {}
        # Parts per batch of each bucket: padded tokens B * bucket stay within max_batch_tokens.
        self.caps = {
            b: max(1, min(max_batch_size, max_batch_tokens // b, rows.get(b, max_batch_size))) for b in self.buckets
        }
        self._queues: dict[int, list[Part]] = {b: [] for b in self.buckets}  # arrival order
        self._jobs: dict[int, Job] = {}  # jobs with a part still queued, by seq
        self._seq = 0
        self.idle_since = -math.inf  # when the engine last finished a batch (monotonic s)
        self.parts = 0  # queued parts
        self.tokens = 0  # queued padded tokens (sum of buckets)

    # ------------------------------------------------------------ queueing

    def bucket_for(self, n_tokens: int) -> int | None:
        """The smallest bucket that holds ``n_tokens``, None when none does."""
        i = bisect.bisect_left(self.buckets, n_tokens)
        return self.buckets[i] if i < len(self.buckets) else None

    def add(self, job: Job) -> None:
        self._seq += 1
        job.seq = self._seq
        job.eff_deadline = job.deadline if job.deadline is not None else job.arrival + self.default_deadline
        # The loop adds jobs only between batches, so idle_since is the end of the last batch
        # that ran before this job could be seen.
        job.idle_arrival = job.arrival >= self.idle_since
        for p in job.parts:
            if p.bucket not in self._queues:
                raise ValueError(f"part of {len(p.ids)} tokens queued for unknown bucket {p.bucket}")
            q = self._queues[p.bucket]
            # Keep arrival order even if the caller hands jobs over slightly out of order.
            if q and q[-1].arrival > job.arrival:
                bisect.insort(q, p, key=lambda x: x.arrival)
            else:
                q.append(p)
            p.queued = True
            self.parts += 1
            self.tokens += p.bucket
        if job.parts:
            self._jobs[job.seq] = job

    def drop(self, job: Job) -> int:
        """Remove the job's queued parts and mark it done. Returns how many were removed."""
        job.done = True
        self._jobs.pop(job.seq, None)
        removed = 0
        for b in {p.bucket for p in job.parts if p.queued}:
            q = self._queues[b]
            keep = [p for p in q if p.job is not job]
            removed += len(q) - len(keep)
            q[:] = keep
        for p in job.parts:
            if p.queued:
                p.queued = False
                self.parts -= 1
                self.tokens -= p.bucket
        return removed

    def expire(self, now: float) -> list[Job]:
        """Drop and return the jobs whose deadline passed before all their parts ran."""
        expired = [j for j in self._jobs.values() if j.deadline is not None and j.deadline <= now]
        for j in expired:
            self.drop(j)
        return expired

    # ------------------------------------------------------------ dispatch

    def _ready(self, b: int, q: list[Part], now: float) -> bool:
        return len(q) >= self.caps[b] or now - q[0].arrival >= self.max_delay or any(p.job.idle_arrival for p in q)

    def next_batch(self, now: float) -> tuple[int, list[Part]] | None:
        """Take the next batch ``(bucket, parts)`` off the queues, or None when nothing is ready."""
        best, best_key = None, math.inf
        for b, q in self._queues.items():
            if q and self._ready(b, q, now):
                key = min(p.job.eff_deadline for p in q)
                if best is None or key < best_key:
                    best, best_key = b, key
        if best is None:
            return None
        q = self._queues[best]
        chosen = sorted(q, key=lambda p: (p.job.priority, p.job.eff_deadline, p.job.seq, p.index))[: self.caps[best]]
        taken = {id(p) for p in chosen}
        q[:] = [p for p in q if id(p) not in taken]
        for p in chosen:
            p.queued = False
            self.parts -= 1
            self.tokens -= p.bucket
            if not any(x.queued for x in p.job.parts):
                self._jobs.pop(p.job.seq, None)
        return best, chosen

    def batch_done(self, now: float) -> None:
        """The engine finished a batch at ``now``: later arrivals find it idle."""
        self.idle_since = now

    def next_wakeup(self, now: float) -> float | None:
        """Seconds until a bucket becomes ready or a deadline passes; None when nothing is queued."""
        if not self.parts:
            return None
        t = math.inf
        for b, q in self._queues.items():
            if q:
                if self._ready(b, q, now):
                    return 0.0
                t = min(t, q[0].arrival + self.max_delay)
        for j in self._jobs.values():
            if j.deadline is not None:
                t = min(t, j.deadline)
        return max(0.0, t - now)

    def queued_jobs(self) -> list[Job]:
        """Jobs with at least one part still queued."""
        return list(self._jobs.values())

    def queued(self, bucket: int) -> int:
        return len(self._queues[bucket])
