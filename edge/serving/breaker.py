"""The circuit breaker: when the primary engine keeps missing deadlines or failing, stop sending
it work and serve from the fallback (or fail fast), then try it again after a cool-down.

The source design's control: after N consecutive timed-out requests, switch to a lightweight
model so that basic service stays up. States (docs/breaker.md)::

    closed     every batch runs on the primary; each request it misses through its own fault counts
               (it failed or hung, or it was late *and* the engine was slow for the batch's shape,
               by its warm-up: edge/serving/engine_cost.py), each it serves in time resets the
               count; N in a row trip the breaker. A client's impossible deadline never counts.
    open       batches run on the fallback (replies say ``degraded``), or fail at once with
               BREAKER_OPEN when there is none, instead of queueing for an engine that times out;
               after ``cooldown_s`` the breaker goes half-open
    half_open  the engine loop runs probes of its own on the primary (the package's warm-up
               sample, a deadline of ``PROBE_DEADLINE_S``), never a client's batch, so no client's
               choice of deadline decides a probe; ``probes`` in a row in time close it, one miss
               opens it again. Clients are served as when open meanwhile.

Owned by the engine loop's thread (it routes every batch and reports every outcome); ``stats``
reads :meth:`snapshot`, a dict built under a lock of its own. Counting is per request, not per
batch: a batch of 8 that times out is 8 misses, as 8 callers saw it.
"""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["BreakerState", "Route", "CircuitBreaker", "Fallback", "PrimaryTimeout", "PROBE_DEADLINE_S", "TRIPS_KEPT"]

# The server's own deadline for a half-open probe: what an interactive client waits at most. An
# engine that serves a probe within it is back; one that hangs is given up on there.
PROBE_DEADLINE_S = 2.0
TRIPS_KEPT = 16  # the latest trips stats.breaker.trips_recent shows, each with why it happened


@dataclass
class Fallback:
    """What serves while the breaker is open: the fallback's engine, loaded and warmed at boot
    (edge/runtime/fallback.py), with input buffers of its own (the primary may still hold its own, stuck
    in a run), and the lineage its replies name."""

    engine: Any
    buffers: dict
    manifest: Any = None
    lineage: Any = None
    # Shapes left to warm once READY (a fresh CPU boot, edge.runtime.engine_chain.warm_plan): the
    # engine loop runs them after the primary's, when idle.
    warm_later: list = field(default_factory=list)


class PrimaryTimeout(Exception):
    """The primary engine did not return before the batch's last deadline (it hangs, or crawls)."""

    def __init__(self, message: str, waited_ms: float = 0.0) -> None:
        super().__init__(message)
        self.waited_ms = waited_ms  # how long the loop waited for the primary before it gave up


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
        self.trips = 0
        self.closes = 0
        self.degraded = 0  # requests served by the fallback
        self.failed_fast = 0  # requests answered BREAKER_OPEN
        self.last_trip: dict | None = None
        self.recent_trips: list[dict] = []  # the latest TRIPS_KEPT trips, oldest first
        self.not_counted = {"impossible_deadline": 0, "engine_not_slow": 0}  # late, but not the engine's fault
        self.probe_results = {"passed": 0, "failed": 0}

    # -------------------------------------------------------- engine loop thread

    def route(self) -> Route:
        """Where the next client batch goes."""
        with self._lock:
            if self.state is BreakerState.CLOSED:
                return Route.PRIMARY
            return Route.FALLBACK if self.has_fallback else Route.FAIL_FAST

    def probe_due(self) -> bool:
        """Whether the engine loop should run a probe now: open for ``cooldown_s``, or half-open."""
        with self._lock:
            if self.state is BreakerState.OPEN:
                assert self.opened_at is not None  # _trip sets it with the state
                if self._clock() - self.opened_at >= self.cooldown_s:
                    self.state, self.successes = BreakerState.HALF_OPEN, 0
            return self.state is BreakerState.HALF_OPEN

    def seconds_to_probe(self) -> float | None:
        """How long the engine loop may sleep before a probe is due (None: no probe pending)."""
        with self._lock:
            if self.state is BreakerState.HALF_OPEN:
                return 0.0
            if self.state is BreakerState.OPEN:
                assert self.opened_at is not None  # _trip sets it with the state
                return max(0.0, self.opened_at + self.cooldown_s - self._clock())
            return None

    def probe_done(self, ok: bool, why: str = "") -> None:
        """The outcome of one of the loop's own probes on the primary."""
        with self._lock:
            if self.state is not BreakerState.HALF_OPEN:
                return
            self.probe_results["passed" if ok else "failed"] += 1
            if not ok:
                self._trip(f"probe failed: {why}", cause="probe")
                return
            self.successes += 1
            if self.successes >= self.probes:
                self.state, self.misses, self.opened_at = BreakerState.CLOSED, 0, None
                self.closes += 1

    def primary_done(self, served: int, missed: int, why: str = "", cause: str = "late") -> None:
        """The outcome of a client batch on the primary: ``served`` requests in time (or late by no
        fault of the engine's), ``missed`` that count against it."""
        with self._lock:
            if self.state is not BreakerState.CLOSED:
                return  # a batch started before the trip: the breaker has already decided
            if missed:
                # Served ones in the same batch came first or last; the batch as a whole missed:
                # consecutive misses go on (a batch half in time is not a recovery).
                self.misses += missed
                if self.misses >= self.threshold:
                    self._trip(why, cause=cause)
            elif served:
                self.misses = 0

    def not_the_engines_fault(self, impossible: int, not_slow: int) -> None:
        """Late requests that did not count: a deadline below the shape's cost, or a batch the
        engine ran at its usual speed (the queue made them late)."""
        with self._lock:
            self.not_counted["impossible_deadline"] += impossible
            self.not_counted["engine_not_slow"] += not_slow

    def count(self, route: Route, requests: int) -> None:
        with self._lock:
            if route is Route.FALLBACK:
                self.degraded += requests
            elif route is Route.FAIL_FAST:
                self.failed_fast += requests

    def _trip(self, why: str, cause: str) -> None:
        """``cause``: late (slow for its shape), failed (the engine raised), hung (gave up on it), probe."""
        self.state, self.opened_at, self.successes = BreakerState.OPEN, self._clock(), 0
        self.trips += 1
        self.last_trip = {"at_monotonic": round(self.opened_at, 3), "after_misses": self.misses, "cause": cause,
                          "why": why[:300]}
        self.recent_trips = (self.recent_trips + [self.last_trip])[-TRIPS_KEPT:]
        self.misses = 0

    # -------------------------------------------------------------- any thread

    def snapshot(self) -> dict:
        with self._lock:
            open_for = None if self.opened_at is None else round(self._clock() - self.opened_at, 3)
            return {"state": self.state.value, "consecutive_misses": self.misses, "threshold": self.threshold,
                    "cooldown_s": self.cooldown_s, "probes": self.probes, "has_fallback": self.has_fallback,
                    "trips": self.trips, "closes": self.closes, "degraded_requests": self.degraded,
                    "failed_fast_requests": self.failed_fast, "open_for_s": open_for, "last_trip": self.last_trip,
                    "trips_recent": list(self.recent_trips), "late_not_counted": dict(self.not_counted),
                    "probes_run": dict(self.probe_results), "probe_deadline_s": PROBE_DEADLINE_S}
