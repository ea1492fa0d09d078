"""SIGTERM, SIGINT or SIGHUP with more queued work than the drain can finish: every message
delivered to the socket, admitted or still unread, gets exactly one reply (a result,
SHUTTING_DOWN or OVERLOADED), the exit status is 0 and the socket file is gone."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
import zmq

from edge.errors import ErrorCode
from edge.ipc import protocol as P

from support.runtime_proc import start_runtime

LONG_TEXT = "maintenance window for the conveyor belt sensors " * 40  # past 256 tokens: a full row


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stop_signal_with_queued_work_answers_every_admitted_request_and_exits_0(minilm_package, tmp_path, sig):
    rt = start_runtime(tmp_path, "--package", str(minilm_package), "--drain-timeout", "1")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        rt.wait_ready()
        sock.connect(rt.address)
        n = 96  # 96 requests of 16 full-length texts: about 30 s of work here, far past the drain
        for i in range(n):
            sock.send_multipart(P.encode_request("infer", {"texts": [LONG_TEXT] * 16, "request_id": i}))
        first = P.decode_reply(sock.recv_multipart())  # the server is busy with them
        rt.proc.send_signal(sig)
        replies = [first]
        while len(replies) < n and sock.poll(15_000, zmq.POLLIN):
            replies.append(P.decode_reply(sock.recv_multipart()))
        code = rt.proc.wait(30)
    finally:
        sock.close(0)
        ctx.term()
        rt.stop()
    ids = sorted(r.body["request_id"] for r in replies)
    assert ids == list(range(n)), f"{len(ids)} replies for {n} requests"  # one each, none lost
    kinds = {r.type if r.type == "infer" else ErrorCode(r.body["code"]).name for r in replies}
    assert "SHUTTING_DOWN" in kinds and kinds <= {"infer", "SHUTTING_DOWN", "OVERLOADED"}, kinds
    assert code == 0, rt.output()
    assert not Path(rt.address[len("ipc://"):]).exists()  # the socket file goes with the server


CLIENTS = 4  # DEALER connections
PER_CLIENT = 100  # requests each: 400 in all
BIG = [LONG_TEXT * 4] * 64  # the most texts a request may hold, of 7,840 bytes: 500 KB of msgpack, 200 MB in all


def _collect(sock: zmq.Socket, monitor: zmq.Socket, expected: int, deadline: float) -> list:
    """Every reply this DEALER holds once its connection to the (exited) server has closed."""
    # DISCONNECTED comes once libzmq has read the connection to its end: every reply the server
    # flushed before it closed is in this socket's queue by then.
    assert monitor.poll(60_000), "the connection to the stopped server never closed"
    replies = []
    while True:
        try:
            replies.append(P.decode_reply(sock.recv_multipart(zmq.NOBLOCK)))
        except zmq.Again:  # waits (up to the deadline, shared by all clients) only when some are missing
            if len(replies) >= expected or not sock.poll(max(0.0, deadline - time.monotonic()) * 1000.0):
                return replies


def _last_reads(output: str) -> list[dict]:
    """The log line of the reads to the end before the socket closed (none if they read nothing)."""
    return [json.loads(line) for line in output.splitlines() if '"shutdown.last_reads"' in line]


@pytest.mark.parametrize("when, drain_s", [("serving", "1"), ("all_unread", "1"), ("all_unread", "0")],
                         ids=["serving", "all_unread", "all_unread-drain_0"])
def test_sigterm_answers_every_message_of_several_clients_exactly_once(minilm_package, tmp_path, when, drain_s):
    """Issue 26 item 9: 400 large requests from 4 connections, then SIGTERM.

    ``serving``: once the first reply is back (the server is working through them).
    ``all_unread``: the server is stopped (SIGSTOP) while the clients connect and send, and gets
    SIGTERM as it resumes: its drain begins before it has read any of them (libzmq accepts the
    connections and takes in their messages on its own threads then). With ``--drain-timeout 0``
    nothing holds the drain open: only the reads to the end answer them.
    """
    rt = start_runtime(tmp_path, "--package", str(minilm_package), "--drain-timeout", drain_s)
    ctx = zmq.Context()
    socks, monitors = [], []
    stopped = False
    try:
        rt.wait_ready()
        if when == "all_unread":
            rt.proc.send_signal(signal.SIGSTOP)
            stopped = True
        for _ in range(CLIENTS):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            monitors.append(s.get_monitor_socket(zmq.EVENT_DISCONNECTED))
            s.connect(rt.address)  # to a stopped server: in its listen backlog
            socks.append(s)
        for i in range(PER_CLIENT):
            for c, s in enumerate(socks):
                s.send_multipart(P.encode_request("infer", {"texts": BIG, "request_id": c * PER_CLIENT + i}))
        if when == "serving":
            poller = zmq.Poller()
            for s in socks:
                poller.register(s, zmq.POLLIN)
            assert poller.poll(60_000), "no reply at all"
        rt.proc.send_signal(signal.SIGTERM)  # pending while stopped: handled as it resumes
        if stopped:
            rt.proc.send_signal(signal.SIGCONT)
            stopped = False
        code = rt.proc.wait(60)
        deadline = time.monotonic() + 30.0  # s: generous; spent only if replies are missing
        replies = [_collect(s, m, PER_CLIENT, deadline) for s, m in zip(socks, monitors)]
    finally:
        if stopped:
            rt.proc.send_signal(signal.SIGCONT)
        for s in (*monitors, *socks):
            s.close(0)
        ctx.term()
        rt.stop()
    last = _last_reads(rt.output())
    for c, got in enumerate(replies):
        sent = range(c * PER_CLIENT, (c + 1) * PER_CLIENT)
        ids = Counter(r.body["request_id"] for r in got)
        missing = [i for i in sent if i not in ids]
        extra = {i: n for i, n in ids.items() if n != 1 or i not in sent}
        assert not missing and not extra, (f"client {c}: {len(missing)} of {PER_CLIENT} unanswered, "
                                           f"{extra} answered twice or not ours", last)
    kinds = Counter(r.type if r.type == "infer" else ErrorCode(r.body["code"]).name for got in replies for r in got)
    assert set(kinds) <= {"infer", "SHUTTING_DOWN", "OVERLOADED"}, kinds
    assert code == 0, rt.output()
    assert len(last) <= 1 and not any(r["left_unread"] or r["cut"] for r in last), last  # none when nothing was left
    assert not Path(rt.address[len("ipc://"):]).exists()
