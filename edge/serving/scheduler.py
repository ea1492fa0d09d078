"""Length-bucketed batch scheduler.

Pure data structure, no threads and no clock of its own: the engine loop owns
it (the queue's one owner), passes ``now`` (``time.monotonic()`` seconds) into every call, and is the
only caller. That makes the policy testable with a fake clock.

Policy (docs/design.md, "Scheduling"; docs/protocol.md, "Scheduling"):

- Each text of a request is a :class:`Part`, queued in the bucket admission chose
  (:meth:`BatchShapes.bucket_for`). A :class:`Request` may span several buckets.
- A bucket is *ready* when it is full (:meth:`BatchShapes.rows` parts),
  when its oldest part has waited ``max_delay_ms``, or when a part of it arrived
  while the engine was idle, i.e. after the last batch had ended (a lone request
  on a quiet device is not delayed; parts that arrive while a batch runs wait
  up to max_delay_ms to fill the next one).
- Every part is ranked by ``(level, served, effective deadline, arrival)``:

  * *level*: its priority, less one for every :data:`PRIORITY_AGE_S` it has waited, but never
    below the best priority queued (so traffic of one priority keeps its deadline order);
  * *served*: the padded tokens already dispatched to its connection (:func:`connection_of`),
    on a virtual clock: a connection that starts queueing starts level with the least served
    one (just below it), so no connection banks credit while idle. Within a level, the least served
    connection goes first: connections share the engine by tokens, whoever sends more;
  * then the effective deadline (a request without a deadline gets arrival +
    ``default_deadline_ms``) and arrival: one connection's own parts of a level go
    earliest deadline first.

- The best-ranked part of any ready bucket picks the bucket; the batch is filled from that
  bucket in rank order, each part taken adding its bucket length to its connection's served
  count, so a batch alternates between the connections that have parts in it.
- Expired requests (deadline passed before their parts ran) and dropped
  requests (cancelled, failed) leave the queues before anything runs.

The bound. A part reaches the best level queued after at most 2 x :data:`PRIORITY_AGE_S`
(priority 2 against priority 0). From then on, its connection's served count has not grown
while it waited, unlike those of the connections being served, so it leads the batch after the
one running once its bucket is ready (max_delay_ms). Only its own connection's earlier parts
of the same level (at most its share of the queue, edge/serving/admission.py) and connections
served even less can go first. With the 0.25 s step, a priority-2 text under a priority-0 flood
waits 0.5 s, then the batch running, then its own, whatever the flood's size.
"""

from __future__ import annotations

import bisect
import heapq
import math
from typing import Any

from edge.serving.request import Part, Request
from edge.serving.shapes import BatchShapes

__all__ = ["BucketScheduler", "PRIORITY_AGE_S", "connection_of"]

# Waiting this long lifts a part one priority level (s). Priority orders a burst, it must not
# order a backlog forever: 2 steps (priority 2 to 0) bound what its priority costs a text to
# 0.5 s, a quarter of the 2 s p95 that tests/hostile/test_priority_flood.py holds a priority-2
# client to under a priority-0 flood. The rest is for the batch running when it has aged and
# for its own: a full 32 x 16 batch of MiniLM took 0.45-0.57 s on 2 busy CPU cores (one text:
# 12 ms), and the wait is counted in batches (a text that ages during one waits for its end).
PRIORITY_AGE_S = 0.25


def connection_of(request: Request) -> Any:
    """The connection ``request`` came on (the transport's ``reply_to.conn``, a number never
    reused), or None where the caller has no connections (a benchmark, a test): then all of its
    requests are one connection's."""
    return getattr(request.reply_to, "conn", None)


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
        # Fair share: per connection with a part queued, its parts queued and the padded tokens
        # dispatched to it (on the virtual clock); both leave when its last part does.
        self._held: dict[Any, int] = {}
        self._served: dict[Any, float] = {}
        self._vtime = 0.0  # the least served count of the connections queued at the last batch (tokens)
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
        if request.parts:
            conn = connection_of(request)
            if conn not in self._held:
                # No credit banked while idle: it starts level with the least served connection,
                # one token below, so that among equals it goes first (a tie lost to an older
                # part of another bucket would cost it a whole batch).
                self._held[conn] = 0
                self._served[conn] = self._vtime - 1.0
            self._held[conn] += len(request.parts)
        for p in request.parts:
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
                self._unqueue(p)
        return removed

    def _unqueue(self, p: Part) -> None:
        p.queued = False
        self.parts -= 1
        self.tokens -= p.bucket
        conn = connection_of(p.request)
        self._held[conn] -= 1
        if not self._held[conn]:
            del self._held[conn], self._served[conn]

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
        ready = [b for b, q in self._queues.items() if q and self._ready(b, q, now)]
        if not ready:
            return None
        floor = min(p.request.priority for b in ready for p in self._queues[b])

        def own(p: Part) -> tuple:  # rank among its connection's parts
            r = p.request
            level = max(floor, r.priority - int((now - r.arrival) / PRIORITY_AGE_S))
            return level, r.eff_deadline, r.seq, p.index

        def rank(p: Part, key: tuple) -> tuple:
            return key[0], self._served[connection_of(p.request)], *key[1:]

        best = min(ready, key=lambda b: min(rank(p, own(p)) for p in self._queues[b]))
        q = self._queues[best]
        # Per connection, its parts of this bucket, best last; a heap of each connection's head.
        lanes: dict[Any, list[tuple[tuple, Part]]] = {}
        for p in q:
            lanes.setdefault(connection_of(p.request), []).append((own(p), p))
        heads = []
        for lane in lanes.values():
            lane.sort(key=lambda e: e[0], reverse=True)
            key, p = lane[-1]
            heads.append((rank(p, key), id(p)))
        heapq.heapify(heads)
        by_id = {id(p): p for p in q}
        chosen: list[Part] = []
        rows = self.shapes.rows(best)
        while heads and len(chosen) < rows:
            _, pid = heapq.heappop(heads)
            p = by_id[pid]
            conn = connection_of(p.request)
            lane = lanes[conn]
            lane.pop()
            chosen.append(p)
            self._served[conn] += p.bucket
            if lane:
                key, nxt = lane[-1]
                heapq.heappush(heads, (rank(nxt, key), id(nxt)))
        taken = {id(p) for p in chosen}
        q[:] = [p for p in q if id(p) not in taken]
        for p in chosen:
            self._unqueue(p)
            if not any(x.queued for x in p.request.parts):
                self._requests.pop(p.request.seq, None)
        if self._served:
            self._vtime = max(self._vtime, min(self._served.values()))
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
