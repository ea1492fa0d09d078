"""The circuit breaker: when the primary engine keeps missing deadlines or failing, stop sending
it work and serve from the fallback (or fail fast), then try it again after a cool-down.

The source design's control: after N consecutive timed-out requests, switch to a lightweight
model so that basic service stays up. States (docs/breaker.md)::

    closed     every batch runs on the primary; each request it misses (deadline passed, the
               engine failed or timed out) counts, each it serves in time resets the count; N in
               a row trip the breaker
    open       batches run on the fallback (replies say ``degraded``), or fail at once with
               BREAKER_OPEN when there is none, instead of queueing for an engine that times out;
               after ``cooldown_s`` the breaker goes half-open
    half_open  one batch at a time goes to the primary as a probe, the rest as when open; when
               ``probes`` requests in a row were served in time it closes, one miss opens it again

Owned by the engine loop's thread (it routes every batch and reports every outcome); ``stats``
reads :meth:`snapshot`, a dict built under a lock of its own. Counting is per request, not per
batch: a batch of 8 that times out is 8 misses, as 8 callers saw it.
"""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["BreakerState", "Route", "CircuitBreaker", "Fallback", "PrimaryTimeout"]


@dataclass
class Fallback:
    """What serves while the breaker is open: the fallback's engine, loaded and warmed at boot
    (edge/fallback.py), with input buffers of its own (the primary may still hold its own, stuck
    in a run), and the lineage its replies name."""

    engine: Any
    buffers: dict
    manifest: Any = None
    lineage: Any = None


class PrimaryTimeout(Exception):
    """The primary engine did not return before the batch's last deadline (it hangs, or crawls)."""


class BreakerState(str, enum.Enum):
    CLOSED = "closed"  # the primary serves
    OPEN = "open"  # tripped: the fallback serves, or requests fail fast
    HALF_OPEN = "half_open"  # cooled down: probes go to the primary


class Route(str, enum.Enum):
    PRIMARY = "primary"
    FALLBACK = "fallback"
    FAIL_FAST = "fail_fast"  # open, and no fallback to serve from


class CircuitBreaker:
    def __init__(self, *, threshold: int = 5, cooldown_s: float = 30.0, probes: int = 3, has_fallback: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if threshold < 1 or probes < 1 or cooldown_s < 0:
            raise ValueError(f"breaker: threshold {threshold} and probes {probes} must be >= 1, "
                             f"cooldown {cooldown_s} s >= 0")
        self.threshold = threshold  # consecutive missed requests that trip it
        self.cooldown_s = cooldown_s  # open this long before a probe
        self.probes = probes  # consecutive requests served in time, in half-open, to close
        self.has_fallback = has_fallback
        self._clock = clock
        self._lock = threading.Lock()
        self.state = BreakerState.CLOSED
        self.misses = 0  # consecutive, while closed
        self.successes = 0  # consecutive probe requests served in time, while half-open
        self.opened_at: float | None = None
        self.probing = False  # a probe batch is on the primary now
        self.trips = 0
        self.closes = 0
        self.degraded = 0  # requests served by the fallback
        self.failed_fast = 0  # requests answered BREAKER_OPEN
        self.last_trip: dict | None = None

    # -------------------------------------------------------- engine loop thread

    def route(self) -> Route:
        """Where the next batch goes. In half-open, the first caller gets the probe."""
        with self._lock:
            if self.state is BreakerState.OPEN and self._clock() - self.opened_at >= self.cooldown_s:
                self.state, self.successes = BreakerState.HALF_OPEN, 0
            if self.state is BreakerState.CLOSED:
                return Route.PRIMARY
            if self.state is BreakerState.HALF_OPEN and not self.probing:
                self.probing = True
                return Route.PRIMARY
            return Route.FALLBACK if self.has_fallback else Route.FAIL_FAST

    def primary_done(self, served: int, missed: int, why: str = "") -> None:
        """The outcome of a batch on the primary: ``served`` requests in time, ``missed`` not."""
        with self._lock:
            if self.state is BreakerState.HALF_OPEN and self.probing:
                self.probing = False
                if missed:
                    self._trip(f"probe failed: {why}")
                    return
                self.successes += served
                if self.successes >= self.probes:
                    self.state, self.misses, self.opened_at = BreakerState.CLOSED, 0, None
                    self.closes += 1
                return
            if self.state is not BreakerState.CLOSED:
                return  # a batch started before the trip: the breaker has already decided
            if missed:
                # Served ones in the same batch came first or last; the batch as a whole missed:
                # consecutive misses go on (a batch half in time is not a recovery).
                self.misses += missed
                if self.misses >= self.threshold:
                    self._trip(why)
            elif served:
                self.misses = 0

    def probe_skipped(self) -> None:
        """The probe :meth:`route` handed out could not go to the primary (still stuck in an old run)."""
        with self._lock:
            self.probing = False

    def count(self, route: Route, requests: int) -> None:
        with self._lock:
            if route is Route.FALLBACK:
                self.degraded += requests
            elif route is Route.FAIL_FAST:
                self.failed_fast += requests

    def _trip(self, why: str) -> None:
        self.state, self.opened_at, self.successes, self.probing = BreakerState.OPEN, self._clock(), 0, False
        self.trips += 1
        self.last_trip = {"at_monotonic": round(self.opened_at, 3), "after_misses": self.misses, "why": why[:300]}
        self.misses = 0

    # -------------------------------------------------------------- any thread

    def snapshot(self) -> dict:
        with self._lock:
            open_for = None if self.opened_at is None else round(self._clock() - self.opened_at, 3)
            return {"state": self.state.value, "consecutive_misses": self.misses, "threshold": self.threshold,
                    "cooldown_s": self.cooldown_s, "probes": self.probes, "has_fallback": self.has_fallback,
                    "trips": self.trips, "closes": self.closes, "degraded_requests": self.degraded,
                    "failed_fast_requests": self.failed_fast, "open_for_s": open_for, "last_trip": self.last_trip}
