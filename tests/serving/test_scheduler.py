"""BucketScheduler policy, with a fake clock (times in seconds)."""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge.serving.request import Request
from edge.serving.scheduler import BucketScheduler
from edge.serving.shapes import BatchShapes
from edge.preload.serving_settings import ServingSettings

BUCKETS = [16, 32, 64, 128, 256]


def scheduler(**kw) -> BucketScheduler:
    """A scheduler over the shapes of these settings (the rest at their defaults)."""
    return BucketScheduler(BatchShapes(ServingSettings(buckets=BUCKETS, **kw)))


def sched(**kw) -> BucketScheduler:
    args = dict(max_batch_size=4, max_batch_tokens=8192, max_delay_ms=2.0)
    args.update(kw)
    s = scheduler(**args)
    s.batch_done(0.0)  # the engine has run once: arrivals after t=0 find it idle
    return s


def job(s: BucketScheduler, lengths, t, *, deadline=None, priority=1, add=True) -> Request:
    ids = [np.arange(n, dtype=np.int64) for n in lengths]
    j = Request(ids, [s.shapes.bucket_for(n) for n in lengths], t, deadline=deadline, priority=priority)
    if add:
        s.add(j)
    return j


def busy(s: BucketScheduler, until: float) -> None:
    """Pretend a batch ran until ``until``: jobs that arrived before then did not find the engine idle."""
    s.batch_done(until)


def test_idle_engine_dispatches_at_once():
    s = sched()
    j = job(s, [10], t=1.0)
    assert j.idle_arrival
    assert s.next_batch(1.0) == (16, j.parts)
    assert s.parts == 0 and s.tokens == 0


def test_multi_bucket_request_arriving_idle_runs_without_delay():
    s = sched()
    job(s, [10, 40], t=1.0)
    b1 = s.next_batch(1.0)
    busy(s, 1.001)
    b2 = s.next_batch(1.001)  # the second part arrived idle too; it is not made to wait max_delay
    assert {b1[0], b2[0]} == {16, 64}


def test_busy_engine_waits_max_delay_then_dispatches_partial_batch():
    s = sched()
    busy(s, 1.0005)  # a batch ran until 1.0005; the loop sees the job (arrived at 1.0) only then
    job(s, [10], t=1.0)
    assert s.next_batch(1.0005) is None
    assert s.next_wakeup(1.0005) == pytest.approx(0.0015)
    assert s.next_batch(1.0019) is None
    bucket, parts = s.next_batch(1.002)
    assert bucket == 16 and len(parts) == 1


def test_full_bucket_dispatches_before_max_delay():
    s = sched()
    busy(s, 5.0)
    jobs = [job(s, [10], t=4.0 + i * 1e-4) for i in range(6)]
    bucket, parts = s.next_batch(4.0006)  # full: 6 queued, cap 4
    assert bucket == 16 and [p.request for p in parts] == jobs[:4]
    assert s.next_batch(4.0006) is None  # 2 left, not full, not old enough
    assert s.next_wakeup(4.0006) == pytest.approx(4.0004 + 0.002 - 4.0006)


def test_max_batch_tokens_bounds_batch():
    s = sched(max_batch_size=32, max_batch_tokens=512)  # 256 bucket -> 2 rows
    busy(s, 10.0)
    for i in range(5):
        job(s, [200], t=1.0 + i)
    assert s.shapes.rows(256) == 2
    sizes = []
    while (b := s.next_batch(10.0)) is not None:
        sizes.append(len(b[1]))
    assert sizes == [2, 2, 1]


def test_oldest_deadline_first_across_buckets():
    s = sched()
    busy(s, 100.0)  # all three arrived while the engine was busy
    a = job(s, [10], t=1.0, deadline=9.0)
    b = job(s, [40], t=2.0, deadline=5.0)
    c = job(s, [100], t=0.5)  # no deadline: ordered as arrival + 30 s
    order = []
    while (batch := s.next_batch(4.0)) is not None:  # all have waited > max_delay
        order.append(batch[1][0].request)
    assert order == [b, a, c]


def test_no_bucket_starves_under_a_stream_of_short_requests():
    s = sched(max_batch_size=2)
    busy(s, 1e9)
    long_job = job(s, [200], t=0.0)
    t, ran_long_at = 0.0, None
    for _step in range(20_000):
        t += 0.01
        job(s, [10], t=t, deadline=t + 0.1)
        job(s, [10], t=t, deadline=t + 0.1)  # a full 16 bucket, with earlier deadlines, at every step
        batch = s.next_batch(t)
        if batch[0] == 256:
            ran_long_at = t
            break
    assert ran_long_at is not None
    # long_job's effective deadline (arrival + 30 s) becomes the earliest once new ones are later
    assert ran_long_at == pytest.approx(29.9, abs=0.02)
    assert long_job.parts[0].queued is False


def test_priority_orders_parts_within_bucket():
    s = sched(max_batch_size=2)
    busy(s, 10.0)
    low = job(s, [10], t=1.0, priority=2)
    mid = job(s, [10], t=1.1, priority=1)
    high = job(s, [10], t=1.2, priority=0)
    _, parts = s.next_batch(1.22)  # before any has waited PRIORITY_AGE_S (test_scheduler_fairness: aging)
    assert [p.request for p in parts] == [high, mid]
    _, parts = s.next_batch(1.22)
    assert [p.request for p in parts] == [low]


def test_expired_jobs_are_dropped_before_running():
    s = sched()
    busy(s, 10.0)
    j1 = job(s, [10, 40], t=1.0, deadline=1.5)
    j2 = job(s, [10], t=1.0, deadline=3.0)
    assert s.next_wakeup(1.0) == pytest.approx(0.002)
    assert s.expire(1.4) == []
    assert s.expire(1.5) == [j1]
    assert j1.finished and s.parts == 1 and s.tokens == 16
    assert s.queued(64) == 0
    _, parts = s.next_batch(2.0)
    assert [p.request for p in parts] == [j2]


def test_partly_run_job_still_expires_and_fully_run_job_does_not():
    s = sched()
    busy(s, 10.0)
    j = job(s, [10, 40], t=1.0, deadline=2.0)
    s.next_batch(1.0021)  # one part (either bucket) runs
    assert s.expire(2.0) == [j] and s.parts == 0
    job(s, [10], t=3.0, deadline=4.0)
    s.next_batch(3.0021)
    assert s.expire(5.0) == []  # it ran: the engine loop answers it


def test_drop_removes_queued_parts_only_once():
    s = sched()
    busy(s, 10.0)
    j = job(s, [10, 10, 40], t=1.0)
    other = job(s, [10], t=1.0)
    assert s.drop(j) == 3 and j.finished
    assert s.drop(j) == 0
    assert s.parts == 1 and s.tokens == 16
    _, parts = s.next_batch(2.0)
    assert [p.request for p in parts] == [other]


def test_next_wakeup_blocks_when_empty():
    s = sched()
    assert s.next_wakeup(0.0) is None
    j = job(s, [10], t=1.0)
    assert s.next_wakeup(1.0) == 0.0  # idle arrival: due now
    s.next_batch(1.0)
    assert s.next_wakeup(1.0) is None
    assert j.parts[0].queued is False


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(1, 256), min_size=1, max_size=4),  # token counts of the texts
            st.one_of(st.none(), st.floats(0.0005, 0.05)),  # deadline after arrival (s)
            st.integers(0, 2),  # priority
            st.sampled_from(["run", "cancel", "none"]),  # what happens after arrival
        ),
        min_size=1,
        max_size=40,
    ),
    st.integers(1, 8),
    st.sampled_from([256, 1024, 8192]),
)
def test_every_part_leaves_exactly_once(ops, max_batch, max_tokens):
    """Whatever the mix, each queued part is dispatched once or dropped with its job, never both."""
    s = scheduler(max_batch_size=max_batch, max_batch_tokens=max_tokens, max_delay_ms=2.0)
    t = 0.0
    dispatched: dict[int, int] = {}
    jobs = []
    for lengths, dl, prio, then in ops:
        t += 0.001
        j = Request([np.zeros(n, np.int64) for n in lengths], [s.shapes.bucket_for(n) for n in lengths], t,
                deadline=None if dl is None else t + dl, priority=prio)
        s.add(j)
        jobs.append(j)
        if then == "cancel":
            s.drop(j)
        s.expire(t)
        if then == "run" and (b := s.next_batch(t)) is not None:
            assert len(b[1]) <= s.shapes.rows(b[0])
            assert all(p.bucket == b[0] and not p.request.finished for p in b[1])
            for p in b[1]:
                dispatched[id(p)] = dispatched.get(id(p), 0) + 1
            s.batch_done(t)
    while s.parts:
        t += 0.001
        s.expire(t)
        while (b := s.next_batch(t)) is not None:
            for p in b[1]:
                dispatched[id(p)] = dispatched.get(id(p), 0) + 1
    assert s.tokens == 0 and not s._requests
    assert all(n == 1 for n in dispatched.values())
    for j in jobs:
        for p in j.parts:
            assert not p.queued
            # j.finished: dropped or expired (some parts may have run before); otherwise every part ran once
            assert dispatched.get(id(p), 0) in ((0, 1) if j.finished else (1,))
