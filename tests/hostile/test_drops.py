"""Clients that read nothing, or leave: every reply the server could not deliver is counted.

The fake-engine server (tests/support/serve_fake.py) in a real process, on a real ipc socket.
"""

from __future__ import annotations

import zmq

from edge.ipc import protocol as P
from edge.ipc.client import EdgeClient
from support.fake_server import ServerProcess, wait_until


def _counted(stats: dict, mtype: str = "infer") -> int:
    """Replies to ``mtype`` requests as the server counts them: sent ok, sent as an error, or dropped."""
    return stats["replies_ok"][mtype] + stats["errors_total"] + stats["replies_dropped"]


def test_a_client_that_reads_nothing_finds_every_reply_counted():
    """6,000 requests, no reads: the replies that fit the queues wait there, the rest are counted as dropped."""
    proc = ServerProcess()
    ctx = zmq.Context()
    flooder = ctx.socket(zmq.DEALER)
    flooder.setsockopt(zmq.LINGER, 0)
    try:
        flooder.connect(proc.address)
        n = 6000
        for i in range(n):
            flooder.send_multipart(P.encode_request("infer", {"texts": [f"t{i} x"], "request_id": i}))
        with EdgeClient(proc.address, timeout_s=10) as c:
            wait_until(lambda: c.stats()["requests"]["infer"] == n and c.health()["queue"]["in_flight"] == 0,
                       60, "every request received and answered")
            stats = c.stats()
        assert _counted(stats) == n, stats
        assert stats["replies_dropped_by_reason"]["hwm"] > 0 and stats["replies_ok"]["infer"] > 0, stats
        got = 0
        while flooder.poll(200, zmq.POLLIN):
            flooder.recv_multipart()
            got += 1
        # what the client finds waiting is what the server sent, ok or error: nothing vanished uncounted
        assert got == stats["replies_ok"]["infer"] + stats["errors_total"], (got, stats)
    finally:
        flooder.close(0)
        ctx.term()
        proc.kill()


def test_replies_to_a_client_that_left_are_counted_as_unroutable_not_ok():
    proc = ServerProcess("--sleep-ms", "50")  # the replies come after the client has gone
    ctx = zmq.Context()
    try:
        leaver = ctx.socket(zmq.DEALER)
        leaver.setsockopt(zmq.LINGER, 2000)  # the requests leave before the socket does
        leaver.connect(proc.address)
        for i in range(20):
            leaver.send_multipart(P.encode_request("infer", {"texts": [f"gone {i}"], "request_id": i}))
        leaver.close()
        with EdgeClient(proc.address, timeout_s=10) as c:
            wait_until(lambda: c.stats()["requests"]["infer"] == 20 and c.health()["queue"]["in_flight"] == 0,
                       30, "the left client's requests answered")
            stats = c.stats()
        assert _counted(stats) == 20, stats
        assert stats["replies_dropped_by_reason"]["unroutable"] >= 10, stats
        assert stats["replies_ok"]["infer"] == 20 - stats["replies_dropped"], stats
    finally:
        ctx.term()
        proc.kill()
