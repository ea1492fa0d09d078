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


def test_half_open_probes_are_the_servers_own_then_it_closes_or_reopens():
    clock = Clock()
    b = CircuitBreaker(threshold=1, cooldown_s=10, probes=3, has_fallback=True, clock=clock)
    b.primary_done(0, 1, "x")
    clock.t += 9.9
    assert not b.probe_due() and b.route() is Route.FALLBACK  # still cooling down
    assert b.seconds_to_probe() == pytest.approx(0.1)
    clock.t += 0.2
    assert b.probe_due() and b.state is BreakerState.HALF_OPEN
    assert b.route() is Route.FALLBACK  # clients never probe: the loop's own probes do
    b.primary_done(5, 0)  # a client batch's outcome decides nothing while half-open
    b.probe_done(True)
    b.probe_done(True)
    assert b.state is BreakerState.HALF_OPEN  # 2 of 3
    b.probe_done(False, "still slow")  # a failed probe: open again, a new cool-down
    assert b.state is BreakerState.OPEN and b.trips == 2 and b.last_trip["cause"] == "probe"
    assert not b.probe_due()
    clock.t += 10.1
    assert b.probe_due()
    for _ in range(3):
        b.probe_done(True)
    assert b.state is BreakerState.CLOSED and b.closes == 1 and b.seconds_to_probe() is None
    assert b.route() is Route.PRIMARY
    snap = b.snapshot()
    assert snap["state"] == "closed" and snap["trips"] == 2 and snap["open_for_s"] is None
    assert [t["cause"] for t in snap["trips_recent"]] == ["late", "probe"], snap["trips_recent"]
    assert snap["probes_run"] == {"passed": 5, "failed": 1}


def test_engine_cost_tells_the_clients_deadline_from_the_engines_slowness():
    from edge.serving.engine_cost import SLOW_FACTOR, SLOW_SLACK_MS, EngineCost

    cost = EngineCost({(1, 16): 10.0, (8, 16): 40.0, (1, 128): 30.0})
    assert cost.expected_ms(1, 16) == 10.0 and cost.expected_ms(5, 16) == 10.0 and cost.expected_ms(8, 16) == 40.0
    # a bucket not warmed (yet): the nearest shorter one's time, scaled up by length; else the nearest longer one's
    assert cost.expected_ms(2, 64) == 10.0 * 64 / 16 and cost.expected_ms(8, 64) == 40.0 * 64 / 16
    assert EngineCost({(1, 128): 30.0}).expected_ms(1, 64) == 30.0 and EngineCost({}).expected_ms(1, 64) is None
    assert cost.impossible(5.0, 1, 16) and not cost.impossible(10.0, 1, 16)
    assert not cost.slow(SLOW_FACTOR * 10 + SLOW_SLACK_MS, 1, 16) and cost.slow(SLOW_FACTOR * 10 + SLOW_SLACK_MS + 1, 1, 16)
    assert EngineCost({}).slow(1.0, 2, 64)  # nothing warmed: nothing to excuse it with
    assert cost.impossible(39.0, 1, 64) and not cost.slow(3 * 40.0 + SLOW_SLACK_MS, 1, 64)  # estimated
    assert EngineCost({(2, 32): 8.0}).expected_ms(1, 32) == 4.0  # below the smallest warmed size: scaled
    cost.add(1, 64, 20.0)  # a deferred warm-up's run, after READY: measured, no longer estimated
    assert cost.expected_ms(2, 64) == 20.0 and cost.slow(3 * 20.0 + SLOW_SLACK_MS + 1, 1, 64)
    cost.add(1, 64, 25.0)
    cost.add(1, 16, 8.0)  # the fastest run is the yardstick
    assert cost.expected_ms(1, 64) == 20.0 and cost.expected_ms(1, 16) == 8.0 and cost.as_dict()["1x64"] == 20.0


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
