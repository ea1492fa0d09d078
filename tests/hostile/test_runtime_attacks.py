"""Attacks on the real runtime (MiniLM, ONNX Runtime) that a valid client can make: a reused
routing id, requests built to be as costly as the limits allow, and messages built to make
the server hold memory. One runtime serves the module; each test checks it still serves."""

from __future__ import annotations

import random
import string
import threading
import time
from pathlib import Path

import msgpack
import pytest
import zmq

from conftest import proc_status
from edge.errors import ErrorCode
from edge.ipc import protocol as P
from edge.ipc.client import EdgeClient
from support.runtime_proc import running_runtime

MAX_TEXT_BYTES = P.Limits().max_text_bytes
MAX_TEXTS = P.Limits().max_texts
HEADROOM = 256 << 20  # the documented bound: the working set plus this (docs/protocol.md, "Limits")
LONG_TEXT = "maintenance window for the conveyor belt sensors " * 40  # past 256 tokens


def random_words_text(rng: random.Random, nbytes: int = MAX_TEXT_BYTES, word: int = 100) -> str:
    """``nbytes`` of random ``word``-letter words: the costliest valid text for WordPiece."""
    words, size = [], 0
    while size + word + 1 <= nbytes:
        words.append("".join(rng.choices(string.ascii_lowercase, k=word)))
        size += word + 1
    return " ".join(words)


@pytest.fixture(scope="module")
def runtime(minilm_package, tmp_path_factory):
    with running_runtime(tmp_path_factory.mktemp("attacks"), "--package", str(minilm_package)) as rt:
        yield rt


def _still_serves(rt) -> None:
    with EdgeClient(rt.address, timeout_s=30) as c:
        assert c.embed(["still serving"]).embeddings.shape == (1, 384)
    assert rt.proc.poll() is None


def _until(check, what: str, deadline_s: float = 120.0) -> None:
    """Wait for a state of the runtime, never a fixed time (a full suite slows it)."""
    end = time.monotonic() + deadline_s
    while not check():
        assert time.monotonic() < end, f"not within {deadline_s:.0f} s: {what}"
        time.sleep(0.05)


def _replies(sock: zmq.Socket, seconds: float, expect: int | None = None) -> list[P.Reply]:
    """Replies within ``seconds``, or as soon as ``expect`` have come."""
    got, end = [], time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0 and len(got) != expect and sock.poll(left * 1000, zmq.POLLIN):
        got.append(P.decode_reply(sock.recv_multipart()))
    return got


def test_a_reused_routing_id_gets_nothing_of_the_earlier_connection(runtime):
    ctx = zmq.Context()
    try:
        victim = ctx.socket(zmq.DEALER)
        victim.setsockopt(zmq.ROUTING_ID, b"shared-id")
        victim.setsockopt(zmq.LINGER, 2000)  # its requests leave before it does
        victim.connect(runtime.address)
        with EdgeClient(runtime.address) as c:
            before = c.stats()
            for i in range(6):  # ~2 s of work: still running when the thief arrives
                victim.send_multipart(P.encode_request("infer", {"texts": [LONG_TEXT] * 16, "request_id": i}))
            victim.close()
            _until(lambda: c.stats()["requests"]["infer"] >= before["requests"]["infer"] + 6, "the server read the six")
            time.sleep(0.3)  # and the victim's disconnect, which frees the id
            thief = ctx.socket(zmq.DEALER)
            thief.setsockopt(zmq.ROUTING_ID, b"shared-id")
            thief.setsockopt(zmq.LINGER, 0)
            thief.connect(runtime.address)
            thief.send_multipart(P.encode_request("cancel", {"request_id": 5}))
            thief.send_multipart(P.encode_request("infer", {"texts": ["the thief's own text"], "request_id": 100}))
            got = _replies(thief, 60.0, expect=2)
            # The thief stays connected until all six of the victim's results were dropped (a state:
            # a loaded machine runs them for seconds), then nothing more may have come to it.
            dropped = lambda: c.stats()["replies_dropped_by_reason"].get("unroutable", 0)  # noqa: E731
            _until(lambda: dropped() >= before["replies_dropped_by_reason"].get("unroutable", 0) + 6,
                   "the victim's six results were dropped as unroutable")
            got += _replies(thief, 0.5)
            thief.close()
    finally:
        ctx.term()
    kinds = [(r.type, r.body.get("request_id"), r.body.get("code")) for r in got]
    assert ("error", 5, int(ErrorCode.UNKNOWN_REQUEST_ID)) in kinds, kinds  # cannot cancel the victim's
    assert ("infer", 100, None) in kinds, kinds  # is served itself
    assert len(got) == 2, kinds  # and gets none of the victim's six results


def test_health_answers_while_the_costliest_valid_requests_run(runtime):
    rng = random.Random(12)
    heavy = {"texts": [random_words_text(rng) for _ in range(MAX_TEXTS)]}
    ctx = zmq.Context()
    worst, done = 0.0, threading.Event()
    try:
        sender = ctx.socket(zmq.DEALER)
        sender.setsockopt(zmq.LINGER, 0)
        sender.connect(runtime.address)
        for i in range(4):
            sender.send_multipart(P.encode_request("infer", {**heavy, "request_id": i}))
        with EdgeClient(runtime.address, timeout_s=10) as probe:
            probe.health()
            t_end = time.monotonic() + 60
            results = []
            while len(results) < 4 and time.monotonic() < t_end:
                t0 = time.monotonic()
                probe.health()
                worst = max(worst, time.monotonic() - t0)
                while sender.poll(0, zmq.POLLIN):
                    results.append(P.decode_reply(sender.recv_multipart()))
                time.sleep(0.02)
        done.set()
        sender.close()
    finally:
        ctx.term()
    assert [r.type for r in results] == ["infer"] * 4, [r.body for r in results]
    assert all(r.body["truncated"] == [True] * MAX_TEXTS for r in results)
    # Before the tokenizer had a thread of its own, one such request held health for 46 s.
    # The figure to meet (p99 <= 50 ms) is measured by `python -m bench.health_load`.
    assert worst < 1.0, f"health took {worst:.3f} s"


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS


def _send_raw(address: str, frames_list: list[list[bytes]], wait_s: float = 3.0,
              expect: int | None = None) -> list[P.Reply]:
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.connect(address)
        for frames in frames_list:
            sock.send_multipart(frames)
        got = _replies(sock, wait_s, expect)
        sock.close()
        return got
    finally:
        ctx.term()


def test_memory_stays_below_the_bound_under_each_memory_attack(runtime):
    """The bound: the working set (RSS once the largest batch has run: interpreter, libraries,
    mapped weights, the engine's arena) plus 256 MiB, whatever these attacks send."""
    rng = random.Random(3)
    with EdgeClient(runtime.address, timeout_s=60) as c:  # the largest batch: 32 rows of 256 tokens
        c.embed([random_words_text(rng, 4096) for _ in range(MAX_TEXTS)])
    working_set = proc_status(runtime.pid, "VmRSS")
    bound = working_set + HEADROOM
    limits = P.Limits()
    header = P.encode_obj({"v": P.VERSION, "type": "infer"})
    peaks = {}

    _reset_peak(runtime.pid)  # 1. one message of 41 frames of 15 MiB (over the frame limit: disconnected)
    _send_raw(runtime.address, [[header] + [b"x" * (15 << 20)] * 41], wait_s=1.0)
    peaks["41 x 15 MiB frames"] = proc_status(runtime.pid, "VmHWM")

    _reset_peak(runtime.pid)  # 2. 41 frames of the most libzmq reads: WRONG_FRAME_COUNT, nothing copied
    replies = _send_raw(runtime.address, [[header] + [b"x" * (limits.max_frame_bytes + (64 << 10))] * 41], expect=1)
    assert [r.body["code"] for r in replies] == [int(ErrorCode.WRONG_FRAME_COUNT)]
    peaks["41 x 4 MiB frames"] = proc_status(runtime.pid, "VmHWM")

    _reset_peak(runtime.pid)  # 3. 60 of the largest valid requests at once, while the server is busy
    big = msgpack.packb({"texts": [random_words_text(rng) for _ in range(MAX_TEXTS)], "deadline_ms": 1},
                        use_bin_type=True)
    replies = _send_raw(runtime.address, [[header, big]] * 60, wait_s=20.0, expect=60)
    codes = {r.body.get("code") for r in replies}
    assert len(replies) == 60 and codes <= {int(ErrorCode.OVERLOADED), int(ErrorCode.DEADLINE_EXCEEDED)}, codes
    peaks["60 x 2 MiB requests"] = proc_status(runtime.pid, "VmHWM")

    _reset_peak(runtime.pid)  # 4. long unique words, to fill the tokenizer's word cache
    requests = []
    for _ in range(40):
        texts = [" ".join("".join(rng.choices(string.ascii_lowercase, k=90)) for _ in range(4))
                 for _ in range(MAX_TEXTS)]
        requests.append([header, msgpack.packb({"texts": texts, "deadline_ms": 1}, use_bin_type=True)])
    replies = _send_raw(runtime.address, requests, wait_s=20.0, expect=40)
    assert len(replies) == 40
    peaks["10,240 long unique words"] = proc_status(runtime.pid, "VmHWM")

    print({k: v >> 20 for k, v in peaks.items()}, "MiB; working set", working_set >> 20, "MiB")
    over = {k: v >> 20 for k, v in peaks.items() if v > bound}
    assert not over, f"peak RSS (MiB) over the bound of {bound >> 20} MiB: {over}"
    _still_serves(runtime)
