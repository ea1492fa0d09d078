"""SIGTERM, SIGINT or SIGHUP with more queued work than the drain can finish: every admitted
request gets exactly one reply (a result or SHUTTING_DOWN), the exit status is 0 and the
socket file is gone."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import zmq

from edge.errors import ErrorCode
from edge.ipc import protocol as P

from runtime_proc import start_runtime

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
