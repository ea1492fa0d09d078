"""The circuit breaker's state machine, the fault-injecting engine and the primary's worker thread
(edge/serving/breaker.py, faults.py, engine_worker.py). The breaker under a real server is in
tests/integration/test_breaker_runtime.py."""

from __future__ import annotations

import threading
import time

import pytest

from edge.serving.breaker import BreakerState, CircuitBreaker, Route
from edge.serving.engine_worker import EngineWorker
from edge.serving.faults import FaultyEngine, InjectedFault, with_faults


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_trips_after_exactly_threshold_consecutive_misses():
    b = CircuitBreaker(threshold=5, has_fallback=True, clock=Clock())
    for _ in range(4):
        assert b.route() is Route.PRIMARY
        b.primary_done(0, 1, "deadline")
    assert b.state is BreakerState.CLOSED and b.misses == 4
    b.primary_done(1, 0)  # one served in time: the count starts again
    assert b.misses == 0
    for i in range(5):
        assert b.route() is Route.PRIMARY, i
        b.primary_done(0, 1, "deadline")
    assert b.state is BreakerState.OPEN and b.trips == 1
    assert b.last_trip["after_misses"] == 5 and b.last_trip["why"] == "deadline"
    assert b.route() is Route.FALLBACK


def test_a_batch_counts_each_request():
    b = CircuitBreaker(threshold=5, clock=Clock())
    b.primary_done(0, 3, "engine failed")
    assert b.state is BreakerState.CLOSED
    b.primary_done(1, 2, "engine failed")  # a batch that partly missed is no recovery
    assert b.state is BreakerState.OPEN


def test_without_a_fallback_it_fails_fast():
    b = CircuitBreaker(threshold=1, clock=Clock())
    b.primary_done(0, 1, "x")
    assert b.route() is Route.FAIL_FAST
    b.count(Route.FAIL_FAST, 3)
    assert b.snapshot()["failed_fast_requests"] == 3


def test_half_open_probes_then_closes_or_reopens():
    clock = Clock()
    b = CircuitBreaker(threshold=1, cooldown_s=10, probes=3, has_fallback=True, clock=clock)
    b.primary_done(0, 1, "x")
    clock.t += 9.9
    assert b.route() is Route.FALLBACK  # still cooling down
    clock.t += 0.2
    assert b.route() is Route.PRIMARY and b.state is BreakerState.HALF_OPEN  # the probe
    assert b.route() is Route.FALLBACK  # one probe at a time
    b.primary_done(2, 0)
    assert b.state is BreakerState.HALF_OPEN  # 2 of 3
    assert b.route() is Route.PRIMARY
    b.primary_done(0, 1, "still slow")  # a failed probe: open again, a new cool-down
    assert b.state is BreakerState.OPEN and b.trips == 2
    assert b.route() is Route.FALLBACK
    clock.t += 10.1
    assert b.route() is Route.PRIMARY
    b.primary_done(3, 0)
    assert b.state is BreakerState.CLOSED and b.closes == 1
    assert b.route() is Route.PRIMARY
    snap = b.snapshot()
    assert snap["state"] == "closed" and snap["trips"] == 2 and snap["open_for_s"] is None


def test_a_batch_from_before_the_trip_does_not_count():
    b = CircuitBreaker(threshold=1, has_fallback=True, clock=Clock())
    b.primary_done(0, 1, "x")
    b.primary_done(5, 0)  # started while closed, ended after the trip
    assert b.state is BreakerState.OPEN


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="threshold"):
        CircuitBreaker(threshold=0)


class Engine:
    name, device = "fake", "cpu"

    def __init__(self, hang: threading.Event | None = None) -> None:
        self.hang = hang
        self.calls = 0

    def run(self, ids, mask):
        self.calls += 1
        if self.hang is not None:
            self.hang.wait(10)
        return [ids, mask]


def test_faulty_engine_delays_and_fails_as_asked():
    assert with_faults(e := Engine(), None, 0) is e
    slow = with_faults(Engine(), 30, 0)
    t0 = time.monotonic()
    assert slow.run(1, 2) == [1, 2]
    assert time.monotonic() - t0 >= 0.03 and slow.name == "fake" and slow.injected["delayed"] == 1
    failing = FaultyEngine(Engine(), error_rate=1.0)
    with pytest.raises(InjectedFault, match="error-rate"):
        failing.run(1, 2)
    half = FaultyEngine(Engine(), error_rate=0.5, seed=1)
    outcomes = []
    for _ in range(200):
        try:
            half.run(1, 2)
            outcomes.append(True)
        except InjectedFault:
            outcomes.append(False)
    assert 60 < outcomes.count(False) < 140
    with pytest.raises(ValueError):
        FaultyEngine(Engine(), error_rate=2)


def test_worker_returns_results_errors_and_gives_up_on_a_hang():
    worker = EngineWorker(Engine())
    worker.start(1, 2)
    assert worker.wait(5) == (True, [1, 2]) and not worker.busy
    release = threading.Event()
    hung = EngineWorker(Engine(hang=release))
    hung.start(3, 4)
    assert hung.wait(0.05) == (False, None) and hung.busy
    with pytest.raises(RuntimeError, match="still running"):
        hung.start(5, 6)
    release.set()
    assert hung.wait(5) == (True, [3, 4])
    deadline = time.monotonic() + 5
    while hung.busy and time.monotonic() < deadline:
        time.sleep(0.001)
    assert not hung.busy

    class Failing:
        def run(self, ids, mask):
            raise ValueError("bad batch")

    failing = EngineWorker(Failing())
    failing.start(1, 2)
    with pytest.raises(ValueError, match="bad batch"):
        failing.wait(5)
    for w in (worker, hung, failing):
        w.stop()
