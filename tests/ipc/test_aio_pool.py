"""AsyncEdgePool (edge/ipc/aio.py, the gateway's client) across an update's handover: a runtime that
answers SHUTTING_DOWN loses the pool's connection to the one that holds the address now, and the
infer it refused is sent again there, once. In-process servers on real ipc sockets."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from edge.errors import EdgeError, ErrorCode
from edge.ipc.aio import AsyncEdgePool
from edge.ipc.server import Lifecycle
from support.ipc_fakes import FakeEngine

NEW = {"model_sha256": "n" * 64, "tokenizer_sha256": "t" * 64, "package_sha256": "p" * 64}  # the old one's: m


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop

    async def settle():  # the readers the pool's close cancelled: let them end
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        await asyncio.gather(*others, return_exceptions=True)

    loop.run_until_complete(settle())
    loop.close()


def _pool(loop, address: str) -> AsyncEdgePool:
    async def start():
        pool = AsyncEdgePool(address, size=2)
        pool.start()
        return pool
    return loop.run_until_complete(start())


def _served_by(loop, pool: AsyncEdgePool) -> str:
    return loop.run_until_complete(pool.embed(["hello"], deadline_ms=5000)).meta["model_sha256"][0]


def _drain_behind_a_held_request(server, engine, client) -> threading.Thread:
    """``server`` draining, kept so by one request its engine holds until ``engine.release`` is set."""
    client.health()
    engine.release.clear()
    engine.running.clear()  # set by earlier runs: wait for this request's
    thread = threading.Thread(target=lambda: client.embed(["held"]), daemon=True)
    thread.start()
    assert engine.running.wait(5)
    server.request_drain()
    deadline = time.monotonic() + 5
    while server.state is not Lifecycle.DRAINING:
        assert time.monotonic() < deadline, server.state
        time.sleep(0.01)
    return thread


def test_an_infer_refused_by_a_draining_runtime_is_served_by_the_one_that_took_its_address(
        make_server, make_client, loop):
    engine = FakeEngine()
    old = make_server(engine)
    pool = _pool(loop, old.address)
    try:
        assert _served_by(loop, pool) == "m"
        held = make_client(old)
        new = make_server(name=".edge.sock.b", lineage=NEW)
        held.health()  # connected to the old server before the handover, as the pool is
        new.take_over(old.address)
        thread = _drain_behind_a_held_request(old, engine, held)
        assert _served_by(loop, pool) == "n"  # refused by the old one, sent again: the new one's
        assert _served_by(loop, pool) == "n"
        assert pool._retiring and all(c.closed for c in pool._retiring)  # nothing waited on it: closed at once
        assert loop.run_until_complete(pool.control("health", 5.0))["state"] in ("ready", "draining")
        engine.release.set()
        thread.join(10)
        assert old.wait(10.0)
        assert loop.run_until_complete(pool.control("health", 5.0))["state"] == "ready"
        assert [_served_by(loop, pool) for _ in range(4)] == ["n"] * 4
    finally:
        engine.release.set()
        pool.close()


def test_without_a_new_runtime_the_second_shutting_down_is_the_callers(make_server, make_client, loop):
    """No runtime took the address: the one retry meets the same draining runtime, and its answer
    stands (the gateway's 503); once it has gone, the pool reaches the next runtime at the address."""
    engine = FakeEngine()
    old = make_server(engine)
    pool = _pool(loop, old.address)
    try:
        assert _served_by(loop, pool) == "m"
        thread = _drain_behind_a_held_request(old, engine, make_client(old))
        with pytest.raises(EdgeError) as refused:
            _served_by(loop, pool)
        assert refused.value.code == ErrorCode.SHUTTING_DOWN
        engine.release.set()
        thread.join(10)
        assert old.wait(10.0)
        fresh = make_server(lineage=NEW)  # the next runtime at the address
        assert fresh.address == old.address and _served_by(loop, pool) == "n"
    finally:
        engine.release.set()
        pool.close()


def test_a_retired_connection_still_delivers_what_it_owes_then_closes(make_server, loop):
    """The refusal comes on a connection with another request still running on the old runtime: the
    new connection serves the retry, and the old one hands over that request's reply, then closes."""
    engine = FakeEngine()
    old = make_server(engine)

    async def scenario():
        pool = AsyncEdgePool(old.address, size=1)  # one connection: the refused request shares it
        pool.start()
        try:
            assert (await pool.embed(["warm"], deadline_ms=5000)).meta["model_sha256"][0] == "m"
            first = pool._conns[0]
            engine.release.clear()
            engine.running.clear()
            held = asyncio.ensure_future(pool.embed(["held"], deadline_ms=30000))
            while not engine.running.is_set():
                await asyncio.sleep(0.01)
            new = make_server(name=".edge.sock.b", lineage=NEW)
            new.take_over(old.address)
            old.request_drain()
            while old.state is not Lifecycle.DRAINING:
                await asyncio.sleep(0.01)
            retried = await pool.embed(["after"], deadline_ms=5000)  # refused on `first`, sent again
            assert retried.meta["model_sha256"][0] == "n"
            assert pool._conns[0] is not first and first.retired and not first.closed  # it owes "held"
            engine.release.set()
            assert (await held).meta["model_sha256"][0] == "m"  # the old runtime finished it
            await asyncio.sleep(0)  # the reader's close after handing it over
            assert first.closed
        finally:
            engine.release.set()
            pool.close()

    loop.run_until_complete(scenario())
    assert old.wait(10.0)
