"""Priority aging and the fair share of connections, in the scheduler (fake clock, seconds) and
in admission (the per-connection share of the queue bound)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge.errors import ErrorCode, FlowError
from edge.ipc.protocol import Limits
from edge.serving.admission import REQUEST_MAX_TEXTS, Admission
from edge.serving.request import Request
from edge.serving.scheduler import PRIORITY_AGE_S, BucketScheduler, connection_of
from edge.serving.shapes import BatchShapes
from edge.preload.serving_settings import ServingSettings

BUCKETS = [16, 32, 64, 128, 256]
BATCH_S = 0.02  # what each simulated batch costs on the fake clock (s)


def sched(**kw) -> BucketScheduler:
    args = dict(buckets=BUCKETS, max_batch_size=4, max_batch_tokens=8192, max_delay_ms=2.0)
    args.update(kw)
    s = BucketScheduler(BatchShapes(ServingSettings(**args)))
    s.batch_done(0.0)
    return s


def conn(n: int) -> SimpleNamespace:
    """A reply address on connection ``n``, as the transport's Peer carries it."""
    return SimpleNamespace(conn=n)


def job(s: BucketScheduler, lengths, t, *, c=1, priority=1, deadline=None) -> Request:
    ids = [np.arange(n, dtype=np.int64) for n in lengths]
    j = Request(ids, [s.shapes.bucket_for(n) for n in lengths], t, deadline=deadline, priority=priority,
                reply_to=conn(c))
    s.add(j)
    return j


def owners(parts) -> list[int]:
    return [p.request.reply_to.conn for p in parts]


def flood(s: BucketScheduler, t: float, *, conns=(1, 2, 3, 4), depth=16, length=10, priority=0) -> None:
    """Top each flooding connection up to ``depth`` queued parts, as clients keeping 16 in flight do."""
    for c in conns:
        for _ in range(depth - s._held.get(conn(c).conn, 0)):
            job(s, [length], t, c=c, priority=priority)


def run_until_served(s: BucketScheduler, target: Request, t: float, **flood_kw) -> tuple[float, list]:
    """Run batches of BATCH_S under a flood until ``target`` has no part queued: (time, owners per batch)."""
    batches = []
    for _ in range(10_000):
        flood(s, t, **flood_kw)
        t += BATCH_S
        s.batch_done(t)
        bucket, parts = s.next_batch(t)
        batches.append(owners(parts))
        if not any(p.queued for p in target.parts):
            return t, batches
    raise AssertionError("never served")


# ------------------------------------------------------------------ aging


def test_priority_still_orders_a_burst():
    s = sched()
    s.batch_done(1.0)
    low = job(s, [10], 0.90, c=1, priority=2)
    high = [job(s, [10], 0.95, c=2, priority=0) for _ in range(4)]
    _, parts = s.next_batch(1.0)  # low has waited 0.1 s: its priority still counts
    assert [p.request for p in parts] == high
    assert low.parts[0].queued


@pytest.mark.parametrize("length", [10, 200])  # the flood in the same bucket, or in another
def test_priority_2_is_served_within_two_age_steps_of_a_priority_0_flood(length):
    s = sched()
    t0 = 1.0
    flood(s, t0, length=length)
    honest = job(s, [10], t0, c=9, priority=2)
    t, batches = run_until_served(s, honest, t0, length=length)
    waited = t - t0
    assert 2 * PRIORITY_AGE_S <= waited <= 2 * PRIORITY_AGE_S + 2 * BATCH_S, waited
    assert all(9 not in b for b in batches[:-1])  # before that the flood's priority 0 went first


def test_aging_within_one_connection():
    """One connection's own priority-0 stream does not hold its priority-2 text forever either."""
    s = sched()
    t0 = 1.0
    old = job(s, [10], t0, c=1, priority=2)
    t, _ = run_until_served(s, old, t0, conns=(1,))
    assert t - t0 <= 2 * PRIORITY_AGE_S + 2 * BATCH_S


def test_one_priority_alone_keeps_its_deadline_order():
    """Aging lifts a part only up to the best priority queued: traffic of one priority is not reordered."""
    s = sched(max_batch_size=1)
    s.batch_done(100.0)
    late = job(s, [10], 1.0, priority=1)  # waited long, no deadline: due at 31 s
    urgent = job(s, [10], 9.0, priority=1, deadline=10.0)
    assert s.next_batch(9.5)[1][0].request is urgent
    assert s.next_batch(9.5)[1][0].request is late


# ------------------------------------------------------------------ fair share


def test_a_batch_alternates_between_connections():
    s = sched(max_batch_size=8)
    s.batch_done(10.0)
    for i in range(20):
        job(s, [10], 1.0 + i * 1e-3, c=1)
    b = [job(s, [10], 2.0 + i * 1e-3, c=2) for i in range(3)]
    _, parts = s.next_batch(10.0)
    assert owners(parts) == [1, 2, 1, 2, 1, 2, 1, 1]
    assert [p.request for p in parts if p.request.reply_to.conn == 2] == b


@pytest.mark.parametrize("length", [10, 200])
def test_an_honest_priority_0_client_goes_in_the_next_batch(length):
    """Four flooding connections at the same priority: the fifth waits for one batch, not for their
    queue (a batch of 8 rows: one round of the five connections fits in it)."""
    s = sched(max_batch_size=8)
    t = 1.0
    for _ in range(50):  # the flood has run a while
        flood(s, t, length=length)
        t += BATCH_S
        s.batch_done(t)
        s.next_batch(t)
    flood(s, t, length=length)
    honest = job(s, [10], t, c=9, priority=0)
    served_at, batches = run_until_served(s, honest, t, length=length)
    assert len(batches) == 1, batches


def test_connections_share_by_tokens_across_buckets():
    """A connection of long texts gets as many padded tokens as one of short texts, not as many texts."""
    s = sched(max_batch_size=32)
    t = 1.0
    tokens = {1: 0, 2: 0}
    for _ in range(400):
        flood(s, t, conns=(1,), depth=64, length=10)  # bucket 16
        flood(s, t, conns=(2,), depth=64, length=200)  # bucket 256
        t += BATCH_S
        s.batch_done(t)
        bucket, parts = s.next_batch(t)
        for p in parts:
            tokens[p.request.reply_to.conn] += p.bucket
    assert tokens[1] == pytest.approx(tokens[2], rel=0.1), tokens


def test_a_connection_banks_no_credit_while_idle():
    """A connection that starts queueing starts level with the least served one: it shares, it
    does not take every batch until it has caught up with hours of someone else's service."""
    s = sched(max_batch_size=4)
    t = 1.0
    for _ in range(100):  # connection 1 alone
        flood(s, t, conns=(1,))
        t += BATCH_S
        s.batch_done(t)
        s.next_batch(t)
    for _i in range(8):
        job(s, [10], t, c=2, priority=0)
    flood(s, t, conns=(1,))
    t += BATCH_S
    s.batch_done(t)
    _, parts = s.next_batch(t)
    assert sorted(owners(parts)) == [1, 1, 2, 2]


def test_without_connections_every_request_is_one_connections():
    assert connection_of(Request([], [], 0.0)) is None
    s = sched()
    s.batch_done(10.0)
    a = Request([np.arange(5)], [16], 1.0)
    s.add(a)
    assert s._held == {None: 1}
    assert s.next_batch(10.0)[1][0].request is a
    assert s._held == {} and s._served == {}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4),  # connection
                          st.lists(st.integers(1, 256), min_size=1, max_size=3),  # token counts
                          st.integers(0, 2),  # priority
                          st.sampled_from(["run", "cancel", "none"])),
                min_size=1, max_size=40),
       st.integers(1, 8))
def test_connection_counts_follow_the_queue(ops, max_batch):
    """Whatever the mix, the per-connection counts are the queued parts and leave with them."""
    s = sched(max_batch_size=max_batch)
    t = 0.0
    for c, lengths, prio, then in ops:
        t += 0.13  # aging steps pass too
        j = job(s, lengths, t, c=c, priority=prio)
        if then == "cancel":
            s.drop(j)
        if then == "run":
            s.next_batch(t)
            s.batch_done(t)
        held: dict[int, int] = {}
        for q in s._queues.values():
            for p in q:
                held[p.request.reply_to.conn] = held.get(p.request.reply_to.conn, 0) + 1
        assert s._held == held and set(s._served) == set(held)
    while s.parts:
        t += 0.01
        while s.next_batch(t) is not None:
            pass
    assert s._held == {} and s._served == {}


# ------------------------------------------------------------------ admission: a connection's share


class CountingTokenizer:
    """One id per word plus two specials; counts its calls."""

    num_special_tokens = 2

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, text, max_length=None):
        self.calls += 1
        ids = [101] + [1000 + len(w) for w in text.split()][: max_length - 2] + [102]
        return SimpleNamespace(ids=ids, truncated=False)


def admission(**kw) -> Admission:
    shapes = BatchShapes(ServingSettings(buckets=BUCKETS, **kw))
    return Admission(CountingTokenizer(), shapes)


def admit(a: Admission, c: int | None, n_texts: int, words: int = 3) -> Request:
    r = Request([], [], 0.0, reply_to=None if c is None else conn(c))
    a.fill(r, [" ".join(["w"] * words)] * n_texts)
    a.admit(r)
    return r


def test_request_max_texts_is_the_protocols():
    assert REQUEST_MAX_TEXTS == Limits().max_texts


def fill_to_share(a: Admission, c: int, n_texts: int) -> list[Request]:
    """Admit requests of ``n_texts`` on connection ``c`` until the next would pass its share."""
    admitted = []
    while a._held.get(c, [0, 0])[0] + n_texts <= a.share(c)[0]:
        admitted.append(admit(a, c, n_texts))
    return admitted


def test_a_lone_connection_may_hold_half_the_queue():
    """An app alone on the device may pipeline several of its largest requests."""
    a = admission()  # the defaults: 1024 texts, 262144 tokens
    assert a.share(1) == (1024 // 2, 262144 // 2)
    for _ in range(4):  # 4 requests of 64 texts of the largest bucket
        assert admit(a, 1, 64, 250).admitted
    assert a.share(1) == (512, 131072)  # holding work does not count it twice


def test_a_flooding_connection_is_told_it_is_overloaded_and_others_are_admitted():
    a = admission()
    first = [admit(a, c, 16) for c in (1, 2, 3, 4)]  # 4 connections hold work
    assert a.share(1) == (1024 // 5, 262144 // 5)  # an equal part, one left for the next to come
    flood = first + [r for c in (1, 2, 3, 4) for r in fill_to_share(a, c, 16)]
    for c in (1, 2, 3, 4):
        with pytest.raises(FlowError) as info:
            admit(a, c, 16)
        assert info.value.code == ErrorCode.OVERLOADED and "connection's share" in info.value.message
    assert a.texts <= 4 * (1024 // 5)
    assert a.share(9) == (1024 // 6, 262144 // 6)
    assert admit(a, 9, 16).admitted  # another connection is still admitted
    for r in [r for r in flood if connection_of(r) == 1][:3]:
        a.release(r)  # replies free the flood's room on its own connection only (192 of 170 now)
    assert admit(a, 1, 1).admitted
    with pytest.raises(FlowError):
        admit(a, 2, 1)


def test_a_refusal_for_the_share_of_texts_costs_no_tokenizing():
    a = admission()
    fill_to_share(a, 1, 64)
    calls = a.tokenizer.calls
    with pytest.raises(FlowError):
        admit(a, 1, 64)
    assert a.tokenizer.calls == calls


def test_the_share_of_tokens_binds_long_texts():
    a = admission()
    long_words = 250  # bucket 256
    share_tokens = a.share(1)[1]
    n = share_tokens // (256 * 16)  # requests of 16 long texts that fit
    for _ in range(n):
        admit(a, 1, 16, long_words)
    with pytest.raises(FlowError) as info:
        admit(a, 1, 16, long_words)
    assert "connection's share" in info.value.message
    assert a._held[1] == [16 * n, share_tokens]


def test_a_lone_connection_can_still_fill_a_small_queue():
    """The share is never less than one request of the most texts, so a small bound stays whole."""
    a = admission(max_queue_requests=20)
    assert a.share(1)[0] == REQUEST_MAX_TEXTS
    for _ in range(20):
        admit(a, 1, 1)
    with pytest.raises(FlowError) as info:
        admit(a, 1, 1)
    assert "queue full" in info.value.message


def test_release_forgets_a_connection_and_no_connection_has_no_share():
    a = admission(max_queue_requests=4096)
    r = admit(a, 1, 8)
    a.release(r)
    assert a._held == {} and a.texts == 0
    for _ in range(300):  # no transport, no connections: only the global bound
        admit(a, None, 8)
    assert a.texts == 2400 and a._held == {}
