"""Serving metrics: counters, errors by code, latency histograms, batch shapes.

Written by two threads (the I/O thread counts requests and replies, the engine
loop counts batches), read by the I/O thread for a ``stats`` reply; a single
lock keeps a snapshot consistent. Every update is a few integer adds.

The Prometheus exposition reads :meth:`Metrics.snapshot` too (``edge/observability/metrics/export.py``,
in base units), so ``stats`` and the metrics endpoint never disagree.
"""

from __future__ import annotations

import bisect
import threading
import time
from typing import Iterable

from edge.errors import ErrorCode

__all__ = ["Histogram", "Metrics", "LATENCY_BOUNDS_MS", "PHASES", "bucket_quantile"]

# Upper bounds of the latency buckets (ms); one more bucket counts everything above.
LATENCY_BOUNDS_MS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
# The phases of an answered infer request, the seed's monitoring points (docs/trace.md): load
# (arrival -> in the engine loop: decode, validate, tokenize), transfer (waiting for its batch,
# staging into the bucket's buffers), forward (the engine's run), post (batch end -> reply sent).
PHASES = ("load", "transfer", "forward", "post")


def bucket_quantile(bounds, counts, q: float, max_: float | None) -> float | None:
    """Upper bound of the bucket holding the q-quantile of ``counts`` (one more than ``bounds``:
    the last counts everything above, and ``max_`` answers for it). None when they hold nothing.
    Also what `edge top` computes from two snapshots' count deltas (edge/commands/top.py)."""
    total = sum(counts)
    if not total:
        return None
    rank, seen = q * total, 0
    for i, c in enumerate(counts):
        seen += c
        if seen >= rank and c:
            return float(bounds[i]) if i < len(bounds) else max_
    return max_


class Histogram:
    """Fixed-bucket histogram (Prometheus style: counts per upper bound, plus sum and max)."""

    __slots__ = ("bounds", "counts", "count", "sum", "max")

    def __init__(self, bounds: Iterable[float] = LATENCY_BOUNDS_MS) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.sum = 0.0
        self.max = 0.0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, v)] += 1
        self.count += 1
        self.sum += v
        if v > self.max:
            self.max = v

    def quantile(self, q: float) -> float | None:
        """Upper bound of the bucket holding the q-quantile (the max for the last bucket)."""
        return bucket_quantile(self.bounds, self.counts, q, self.max)

    def snapshot(self) -> dict:
        return {
            "bounds": list(self.bounds),
            "counts": list(self.counts),
            "count": self.count,
            "sum": round(self.sum, 3),
            "max": round(self.max, 3),
            "p50": self.quantile(0.5),
            "p95": self.quantile(0.95),
            "p99": self.quantile(0.99),
        }


class Metrics:
    def __init__(self, buckets: Iterable[int]) -> None:
        self._lock = threading.Lock()
        self.started = time.monotonic()
        self.requests = {t: 0 for t in ("infer", "cancel", "health", "stats", "invalid")}  # messages received
        self.texts = 0  # texts accepted into the queue
        self.ok = {t: 0 for t in ("infer", "cancel", "health", "stats")}  # successful replies
        self.errors: dict[int, int] = {int(c): 0 for c in ErrorCode}  # error replies by code
        self.queue_ms = Histogram()  # arrival -> batch start (longest part of a request)
        self.compute_ms = Histogram()  # engine.run time per batch
        self.total_ms = Histogram()  # arrival -> reply handed to the socket, per infer request
        self.phase_ms = {p: Histogram() for p in PHASES}  # per answered infer request, each phase
        self.batches = 0
        self.batch_sizes: dict[int, int] = {}  # texts per batch -> batches
        self.engine_failures = 0
        # Replies never sent: "hwm" the peer's queue was full (it does not read), "unroutable" the
        # peer was gone. A reply counts once: sent ok, sent as an error, or dropped here.
        self.dropped = {"hwm": 0, "unroutable": 0}
        self.by_bucket = {b: {"batches": 0, "texts": 0, "tokens": 0, "padded_tokens": 0} for b in buckets}

    # --------------------------------------------------------- I/O thread

    def received(self, mtype: str) -> None:
        with self._lock:
            self.requests[mtype if mtype in self.requests else "invalid"] += 1

    def accepted(self, n_texts: int) -> None:
        with self._lock:
            self.texts += n_texts

    def replied(self, mtype: str, queue_ms: float | None = None, total_ms: float | None = None,
                phases: Iterable[float | None] = ()) -> None:
        """``phases``: ms of load, transfer, forward, post (:data:`PHASES`), None where unknown."""
        with self._lock:
            self.ok[mtype] = self.ok.get(mtype, 0) + 1
            if queue_ms is not None:
                self.queue_ms.observe(queue_ms)
            if total_ms is not None:
                self.total_ms.observe(total_ms)
            for name, v in zip(PHASES, phases):
                if v is not None:
                    self.phase_ms[name].observe(max(0.0, v))

    def reply_dropped(self, reason: str) -> None:
        with self._lock:
            self.dropped[reason] += 1

    def error(self, code: int) -> None:
        with self._lock:
            self.errors[int(code)] = self.errors.get(int(code), 0) + 1

    # -------------------------------------------------------- engine loop

    def batch(self, bucket: int, texts: int, rows: int, width: int, tokens: int, compute_ms: float,
              padded_tokens: int | None = None) -> None:
        """A batch of ``texts`` real rows (``rows`` x ``width`` run, padded) holding ``tokens`` real tokens;
        ``padded_tokens``: what its engine calls ran in all, when they were several (else rows x width)."""
        with self._lock:
            self.batches += 1
            self.batch_sizes[texts] = self.batch_sizes.get(texts, 0) + 1
            self.compute_ms.observe(compute_ms)
            s = self.by_bucket.setdefault(bucket, {"batches": 0, "texts": 0, "tokens": 0, "padded_tokens": 0})
            s["batches"] += 1
            s["texts"] += texts
            s["tokens"] += tokens
            s["padded_tokens"] += rows * width if padded_tokens is None else padded_tokens

    def engine_failed(self) -> None:
        with self._lock:
            self.engine_failures += 1

    # ----------------------------------------------------------- reading

    def snapshot(self) -> dict:
        """A JSON/msgpack-ready dict (string keys only)."""
        with self._lock:
            tokens = sum(s["tokens"] for s in self.by_bucket.values())
            padded = sum(s["padded_tokens"] for s in self.by_bucket.values())
            return {
                "uptime_s": round(time.monotonic() - self.started, 3),
                "requests": dict(self.requests),
                "replies_ok": dict(self.ok),
                "texts_accepted": self.texts,
                "errors": [
                    {"code": c, "name": ErrorCode(c).name if c in ErrorCode._value2member_map_ else str(c), "count": n}
                    for c, n in sorted(self.errors.items())
                    if n
                ],
                "errors_total": sum(self.errors.values()),
                "replies_dropped": sum(self.dropped.values()),
                "replies_dropped_by_reason": dict(self.dropped),
                "latency_ms": {
                    "queue": self.queue_ms.snapshot(),
                    "compute": self.compute_ms.snapshot(),
                    "total": self.total_ms.snapshot(),
                    **{name: h.snapshot() for name, h in self.phase_ms.items()},
                },
                "batches": {
                    "count": self.batches,
                    "sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
                    "engine_failures": self.engine_failures,
                    # real tokens / tokens the engine computed (padding rows and columns included)
                    "padding_efficiency": round(tokens / padded, 4) if padded else None,
                    "by_bucket": {str(b): dict(s) for b, s in sorted(self.by_bucket.items())},
                },
            }
