"""The deferred warm-up (``edge serve --warm-up``): shapes boot left for after READY run on the idle
engine loop, one at a time, never ahead of a client's request, and join the breaker's yardstick."""

from __future__ import annotations

import time

import pytest

from edge.serving import engine_loop
from edge.serving.engine_cost import EngineCost
from edge.serving.faults import with_faults
from support.ipc_fakes import MAX_SEQ, SERVING, FakeEngine, FakeTokenizer, expected_embedding, text_of_tokens
from support.ipc_waits import wait_in_flight

SAMPLE = [1, 77, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 2]  # CLS ... SEP
LATER = [(1, 16), (1, 32), (1, 64)]  # the conftest's buckets after the smallest (8), smallest first
WAIT_S = 10.0


def _warm_up(client) -> dict:
    return client.stats()["warm_up"]


def _until_done(client) -> dict:
    deadline = time.monotonic() + WAIT_S
    while (w := _warm_up(client))["deferred_left"]:
        assert time.monotonic() < deadline, w
        time.sleep(0.005)  # poll interval
    return w


def _core_kw() -> dict:
    return {"cost": EngineCost({(1, 8): 1.0}), "probe_ids": SAMPLE, "warm_later": list(LATER)}


def test_the_idle_engine_warms_each_deferred_shape_once_and_learns_its_cost(make_server, make_client):
    engine = FakeEngine()
    server = make_server(engine, core_kw=_core_kw())
    c = make_client(server)
    w = _until_done(c)
    assert engine.calls[:3] == LATER  # one run each, smallest first, the bucket's full width
    assert set(w["after_ready_ms"]) == {"1x16", "1x32", "1x64"}
    assert set(w["yardstick_ms"]) == {"1x8", "1x16", "1x32", "1x64"}  # boot's one shape and the three
    assert server.core.loop.cost.expected_ms(1, 64) == pytest.approx(w["after_ready_ms"]["1x64"], abs=1e-3)
    assert engine.padding_violations == 0  # the bucket's buffers were left as a batch expects them
    text = "served after the warm-up"
    got = c.embed([text])
    assert (abs(got.embeddings[0] - expected_embedding(FakeTokenizer().encode(text, max_length=64).ids)) < 1e-6).all()


def test_a_request_waits_for_one_deferred_run_at_most(make_server, make_client):
    engine = FakeEngine()
    engine.release.clear()  # hold the first deferred run
    server = make_server(engine, core_kw=_core_kw())
    c = make_client(server)
    assert engine.running.wait(WAIT_S)  # the loop is inside the 1x16 run
    c.send("infer", {"texts": ["a lone request"], "request_id": 1})
    deadline = time.monotonic() + WAIT_S
    while server.core.loop.sched.queued_requests() == [] and not server.core.loop._intake:
        assert time.monotonic() < deadline, "the request never reached the engine loop"
        time.sleep(0.001)
    engine.release.set()
    reply = c.recv(WAIT_S)
    assert not reply.is_error and reply.body["request_id"] == 1
    _until_done(c)
    # The request's batch (1 x its own length) ran right after the run it waited for, before the rest.
    assert engine.calls[0] == (1, 16) and engine.calls[1] == (1, 5) and engine.calls[2:4] == [(1, 32), (1, 64)], engine.calls


@pytest.mark.parametrize("bad", ["raises", "not finite"])
def test_a_failed_deferred_run_ends_the_deferred_warm_up_and_serving_goes_on(make_server, make_client, bad):
    if bad == "raises":
        engine = FakeEngine(fail_on=77)  # in the warm-up's sample, in no client text here
    else:
        class NaNEngine(FakeEngine):
            def run(self, input_ids, attention_mask):
                out = super().run(input_ids, attention_mask)
                if (input_ids == 77).any():
                    out[:] = float("nan")
                return out
        engine = NaNEngine()
    server = make_server(engine, core_kw=_core_kw())
    c = make_client(server)
    w = _until_done(c)
    assert w["after_ready_ms"] == {} and set(w["yardstick_ms"]) == {"1x8"}  # the bad run taught nothing
    assert engine.calls == [(1, 16)]  # the first failure ended it
    assert c.embed(["still serving"]).embeddings.shape == (1, 8)


def test_a_request_sent_at_ready_is_served_before_any_deferred_run(make_server, make_client, monkeypatch):
    """The warm-up waits for a quiet engine: here 3 s without a request (an upper bound on how long
    the request below takes to arrive, not a figure it is timed against)."""
    monkeypatch.setattr(engine_loop, "WARM_QUIET_S", 3.0)
    engine = FakeEngine()
    server = make_server(engine, core_kw=_core_kw())
    c = make_client(server)
    c.embed(["sent at ready"])
    assert engine.calls == [(1, 5)] and _warm_up(c)["deferred_left"] == ["1x16", "1x32", "1x64"]
    _until_done(c)
    assert engine.calls[1:] == LATER


def test_traffic_cannot_keep_the_deferred_warm_up_from_running(make_server, make_client, monkeypatch):
    """Past WARM_FORCE_S the runs go between batches even with requests queued (here: never quiet)."""
    monkeypatch.setattr(engine_loop, "WARM_QUIET_S", 3600.0)
    monkeypatch.setattr(engine_loop, "WARM_FORCE_S", 0.0)
    engine = FakeEngine()
    engine.release.clear()
    server = make_server(engine, core_kw=_core_kw())
    c = make_client(server)
    assert engine.running.wait(WAIT_S)  # inside the first deferred run
    for rid in (1, 2):
        c.send("infer", {"texts": ["queued behind the warm-up"], "request_id": rid})
    wait_in_flight(server, 2)
    engine.release.set()
    assert sorted(r.body["request_id"] for r in (c.recv(WAIT_S), c.recv(WAIT_S))) == [1, 2]
    _until_done(c)
    # one deferred run, then the queued batch (both requests, 1 x 5 tokens each), then the rest
    assert engine.calls == [(1, 16), (2, 6), (1, 32), (1, 64)], engine.calls


def test_the_deferred_yardstick_is_measured_without_injected_faults(make_server, make_client):
    """--fault-engine-delay-ms slows client batches, as boot's warm-up, run before the wrapping,
    never saw: the deferred runs go around it too, or the breaker would learn the fault as normal."""
    delay_ms = 300.0
    engine = FakeEngine()
    server = make_server(with_faults(engine, delay_ms, None), core_kw=_core_kw())
    c = make_client(server)
    w = _until_done(c)
    assert all(ms < delay_ms for ms in w["after_ready_ms"].values()), w
    assert c.embed(["a client's batch is delayed"]).meta["compute_ms"] >= delay_ms


def test_impossible_deadlines_on_a_bucket_not_warmed_yet_cannot_trip_the_breaker(make_server, make_client,
                                                                                  monkeypatch):
    """While a bucket's deferred run has not come (here: held off), the breaker estimates its need
    from the warmed one; a client's 1 ms deadlines are its own choice, not the engine's miss."""
    monkeypatch.setattr(engine_loop, "WARM_QUIET_S", 3600.0)
    monkeypatch.setattr(engine_loop, "WARM_FORCE_S", 3600.0)
    engine = FakeEngine(sleep_s=0.005)  # every call 5 ms: past a 1 ms deadline, as fast as it ever is
    server = make_server(engine, core_kw=_core_kw())
    c = make_client(server)
    threshold = server.core.breaker.threshold
    for rid in range(3 * threshold):
        c.send("infer", {"texts": [text_of_tokens(40, word=f"h{rid}x")], "request_id": rid, "deadline_ms": 1})
        c.recv(WAIT_S)  # answered (late, or DEADLINE_EXCEEDED in the queue): either way not the engine's fault
    stats = c.stats()
    assert stats["warm_up"]["deferred_left"] == ["1x16", "1x32", "1x64"]  # the 64 bucket still unmeasured
    assert stats["breaker"]["state"] == "closed" and stats["breaker"]["consecutive_misses"] == 0, stats["breaker"]


def test_the_fallbacks_deferred_shapes_run_after_the_primarys(make_server, make_client):
    from edge.preload.serving_settings import ServingSettings
    from edge.serving.breaker import Fallback
    from edge.serving.shapes import BatchShapes
    from edge.warmup import preallocate

    shapes = BatchShapes(ServingSettings.model_validate(SERVING), max_seq_length=MAX_SEQ, kind="cpu")
    spare = FakeEngine()
    fallback = Fallback(spare, preallocate(shapes, spare), warm_later=list(LATER))
    primary = FakeEngine()
    server = make_server(primary, core_kw={**_core_kw(), "fallback": fallback})
    c = make_client(server)
    deadline = time.monotonic() + WAIT_S
    while (w := _warm_up(c))["deferred_left"] or w["fallback_deferred_left"]:
        assert time.monotonic() < deadline, w
        time.sleep(0.005)  # poll interval
    assert primary.calls[:3] == LATER and spare.calls == LATER  # one run each, on its own engine
    assert set(w["fallback_after_ready_ms"]) == {"1x16", "1x32", "1x64"} and spare.padding_violations == 0
    assert set(w["yardstick_ms"]) == {"1x8", "1x16", "1x32", "1x64"}  # the primary's alone
