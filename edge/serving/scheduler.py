"""Length-bucketed batch scheduler.

Pure data structure, no threads and no clock of its own: the engine loop owns
it (the queue's one owner), passes ``now`` (``time.monotonic()`` seconds) into every call, and is the
only caller. That makes the policy testable with a fake clock.

Policy (docs/design.md, "Scheduling"):

- Each text of a request is a :class:`Part`, queued in the bucket admission chose
  (:meth:`BatchShapes.bucket_for`). A :class:`Request` may span several buckets.
- A bucket is *ready* when it is full (:meth:`BatchShapes.rows` parts),
  when its oldest part has waited ``max_delay_ms``, or when a part of it arrived
  while the engine was idle, i.e. after the last batch had ended (a lone request
  on a quiet device is not delayed; parts that arrive while a batch runs wait
  up to max_delay_ms to fill the next one).
- Among ready buckets the one holding the earliest effective deadline runs
  first (a request without a deadline gets arrival + ``default_deadline_ms``),
  so no bucket starves.
- Inside the chosen bucket, parts go by (priority, effective deadline, arrival):
  priority 0 first.
- Expired requests (deadline passed before their parts ran) and dropped
  requests (cancelled, failed) leave the queues before anything runs.
"""

from __future__ import annotations

import bisect
import math

from edge.serving.request import Part, Request
from edge.serving.shapes import BatchShapes

__all__ = ["BucketScheduler"]


class BucketScheduler:
    """The queues of one serving core; the engine loop is its only caller."""

    def __init__(self, shapes: BatchShapes) -> None:
        self.shapes = shapes
        self.buckets = shapes.buckets
        self.max_delay = shapes.settings.max_delay_ms / 1000.0  # s
        self.default_deadline = shapes.settings.default_deadline_ms / 1000.0  # s
        self._queues: dict[int, list[Part]] = {b: [] for b in self.buckets}  # arrival order
        self._requests: dict[int, Request] = {}  # requests with a part still queued, by seq
        self._seq = 0
        self.idle_since = -math.inf  # when the engine last finished a batch (monotonic s)
        self.parts = 0  # queued parts
        self.tokens = 0  # queued padded tokens (sum of buckets)

    # ------------------------------------------------------------ queueing

    def add(self, request: Request) -> None:
        self._seq += 1
        request.seq = self._seq
        deadline = request.deadline
        request.eff_deadline = deadline if deadline is not None else request.arrival + self.default_deadline
        # The loop adds requests only between batches, so idle_since is the end of the last batch
        # that ran before this request could be seen.
        request.idle_arrival = request.arrival >= self.idle_since
        for p in request.parts:
            if p.bucket not in self._queues:
                raise ValueError(f"part of {len(p.ids)} tokens queued for unknown bucket {p.bucket}")
            q = self._queues[p.bucket]
            # Keep arrival order even if the caller hands requests over slightly out of order.
            if q and q[-1].arrival > request.arrival:
                bisect.insort(q, p, key=lambda x: x.arrival)
            else:
                q.append(p)
            p.queued = True
            self.parts += 1
            self.tokens += p.bucket
        if request.parts:
            self._requests[request.seq] = request

    def drop(self, request: Request) -> int:
        """Remove the request's queued parts and mark it finished. Returns how many were removed."""
        request.finished = True
        self._requests.pop(request.seq, None)
        removed = 0
        for b in {p.bucket for p in request.parts if p.queued}:
            q = self._queues[b]
            keep = [p for p in q if p.request is not request]
            removed += len(q) - len(keep)
            q[:] = keep
        for p in request.parts:
            if p.queued:
                p.queued = False
                self.parts -= 1
                self.tokens -= p.bucket
        return removed

    def expire(self, now: float) -> list[Request]:
        """Drop and return the requests whose deadline passed before all their parts ran."""
        expired = [j for j in self._requests.values() if j.deadline is not None and j.deadline <= now]
        for j in expired:
            self.drop(j)
        return expired

    # ------------------------------------------------------------ dispatch

    def _ready(self, b: int, q: list[Part], now: float) -> bool:
        return (len(q) >= self.shapes.rows(b) or now - q[0].arrival >= self.max_delay
                or any(p.request.idle_arrival for p in q))

    def next_batch(self, now: float) -> tuple[int, list[Part]] | None:
        """Take the next batch ``(bucket, parts)`` off the queues, or None when nothing is ready."""
        best, best_key = None, math.inf
        for b, q in self._queues.items():
            if q and self._ready(b, q, now):
                key = min(p.request.eff_deadline for p in q)
                if best is None or key < best_key:
                    best, best_key = b, key
        if best is None:
            return None
        q = self._queues[best]
        order = lambda p: (p.request.priority, p.request.eff_deadline, p.request.seq, p.index)  # noqa: E731
        chosen = sorted(q, key=order)[: self.shapes.rows(best)]
        taken = {id(p) for p in chosen}
        q[:] = [p for p in q if id(p) not in taken]
        for p in chosen:
            p.queued = False
            self.parts -= 1
            self.tokens -= p.bucket
            if not any(x.queued for x in p.request.parts):
                self._requests.pop(p.request.seq, None)
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
        for j in self._requests.values():
            if j.deadline is not None:
                t = min(t, j.deadline)
        return max(0.0, t - now)

    def queued_requests(self) -> list[Request]:
        """Requests with at least one part still queued."""
        return list(self._requests.values())

    def queued(self, bucket: int) -> int:
        return len(self._queues[bucket])
