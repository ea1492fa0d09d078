"""The server as its own process: fuzz of malformed messages, RSS bound, idle CPU, SIGTERM drain, CLI."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq

from edge.ipc import protocol as P
from edge.errors import ErrorCode
from edge.ipc.client import EdgeClient
from support.fake_server import ServerProcess, wait_until
from support.ipc_fakes import FakeTokenizer, expected_embedding


@pytest.fixture(scope="module")
def server():
    s = ServerProcess()
    yield s
    s.kill()


@pytest.fixture
def dealer(server):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.address)
    yield sock
    sock.close()


def _recv(sock, timeout_s=10.0) -> P.Reply:
    assert sock.poll(int(timeout_s * 1000)), "no reply"
    frames = sock.recv_multipart()
    if frames and frames[0] == b"":  # the request began with an empty frame: answered REQ-style
        frames = frames[1:]
    return P.decode_reply(frames)


VALID = P.encode_request("infer", {"texts": ["fuzz me please", "and me"], "request_id": "v", "priority": 1})
HEADER = P.encode_obj({"v": 1, "type": "infer"})
_ANY_BAD = [b"b", [], {}, [1, "x"], {"a": 1}]
BAD_VALUES = {  # none of these is valid for its field
    "texts": [None, True, 1.5, -1, "s", "\u00e9" * 3, [None], [["a"]], *_ANY_BAD],
    "request_id": [True, 1.5, -1, 2**64 - 1, "", "r" * 129, *_ANY_BAD],
    "deadline_ms": [True, "s", -1, 0, 2**40, *_ANY_BAD],
    "priority": [True, 1.5, -1, 3, 2**40, "s", *_ANY_BAD],
    "truncate": [1.5, -1, 0, 1, "s", *_ANY_BAD],
}


def fuzz_message(rng: random.Random) -> list[bytes]:
    """One message that is invalid for sure; about a dozen families."""
    kind = rng.randrange(9)
    if kind == 0:  # random bytes, 1-3 frames
        return [rng.randbytes(rng.randint(1, 300)) for _ in range(rng.randint(1, 3))]
    if kind == 1:  # truncated msgpack of a valid request
        i = rng.randrange(2)
        fr = list(VALID)
        fr[i] = fr[i][: rng.randrange(len(fr[i]))]
        return fr
    if kind == 2:  # a field of the wrong type (or out of range)
        field = rng.choice(list(BAD_VALUES))
        return [HEADER, P.encode_obj({"texts": ["ok"], field: rng.choice(BAD_VALUES[field])})]
    if kind == 3:  # extra or missing frames
        return list(VALID) + [rng.randbytes(rng.randint(0, 20)) for _ in range(rng.randint(1, 5))] if rng.random() < 0.7 else [VALID[0]]
    if kind == 4:  # header mutations: version, type, shape, JSON garbage
        return rng.choice([
            [P.encode_obj({"v": rng.choice([0, 2, 99]), "type": "infer"}), VALID[1]],
            [P.encode_obj({"v": 1, "type": rng.choice(["", "INFER", "embed", "x" * 200])}), VALID[1]],
            [P.encode_obj({"v": 1}), VALID[1]],
            [P.encode_obj(["infer", 1]), VALID[1]],
            [b'{"v":1,"type":"infer"', b"{}"],
            [b'{"v":1,"type":"infer"}', b'{"texts":[1e999999]}'],
            [b'{"v":1,"type":"infer"}', b"[" * rng.randint(1000, 50000)],
        ])
    if kind == 5:  # invalid values: empty text, too many texts, out of range options
        return [HEADER, P.encode_obj(rng.choice([
            {"texts": [" "]}, {"texts": []}, {"texts": ["a"] * rng.randint(65, 200)},
            {"texts": ["a"], "priority": rng.choice([3, -1, 100])}, {"texts": ["a"], "deadline_ms": rng.choice([0, -1, 1e12])},
            {"texts": ["a" * (32768 + rng.randint(1, 1000))]}, {"texts": ["a"], "extra": 1},
        ]))]
    if kind == 6:  # deep nesting and a declared length far past the data
        return rng.choice([[HEADER, b"\x91" * rng.randint(200, 20000)], [HEADER, b"\xdd\xff\xff\xff\xff"], [HEADER, b"\xdb\x7f\xff\xff\xff"]])
    if kind == 7:  # cancel / health / stats with bad bodies
        return rng.choice([
            P.encode_request("cancel", {}), P.encode_request("cancel", {"request_id": 1.5}),
            P.encode_request("health", {"x": 1}), P.encode_request("stats", [1]),
        ])
    # kind 8: body is valid msgpack but not a map, or a map with a non-string key
    return [HEADER, rng.choice([P.encode_obj(rng.choice([1, "x", [1], None, 2.5])), b"\x81\x01\x01"])]


def huge_message(rng: random.Random) -> list[bytes]:
    """A frame over the 4 MiB limit that is still read (FRAME_TOO_LARGE); past 4 MiB + 64 KiB
    libzmq closes the connection instead (docs/protocol.md, "Limits and hostile clients")."""
    return [HEADER, b"\x00" * (4 * 1024 * 1024 + rng.randint(1, 64 * 1024))]


def _check_valid(sock) -> None:
    sock.send_multipart(VALID)
    r = _recv(sock)
    assert r.type == "infer", r.body
    emb = P.embeddings_from_frame(r.extra[0], 2, 8)
    tok = FakeTokenizer()
    np.testing.assert_allclose(emb[0], expected_embedding(tok.encode("fuzz me please").ids), rtol=1e-6)


def fuzz_round(sock, rng, n, huge_every=500) -> dict:
    """Send n malformed messages in windows, expect exactly one 1xxx error reply each."""
    codes: dict[int, int] = {}
    sent = 0
    while sent < n:
        window = min(200, n - sent)
        for i in range(window):
            msg = huge_message(rng) if (sent + i) % huge_every == huge_every - 1 else fuzz_message(rng)
            sock.send_multipart(msg)
        for _ in range(window):
            r = _recv(sock)
            assert r.is_error and 1000 <= r.body["code"] < 2000, r.body
            codes[r.body["code"]] = codes.get(r.body["code"], 0) + 1
        sent += window
    return codes


def test_fuzz_10k_malformed_messages(server, dealer):
    rng = random.Random(20261129)
    _check_valid(dealer)
    fuzz_round(dealer, rng, 2000, huge_every=200)  # warm-up: the allocator reaches its working size
    rss0 = server.rss_kib()
    t0 = time.monotonic()
    codes = fuzz_round(dealer, rng, 10_000)
    elapsed = time.monotonic() - t0
    rss1 = server.rss_kib()
    assert dealer.poll(300) == 0, "a message got more than one reply"
    # over the hard limit (4 x max_frame_bytes) libzmq drops the connection instead of reading it all
    rude = zmq.Context.instance().socket(zmq.DEALER)
    rude.setsockopt(zmq.LINGER, 0)
    rude.connect(server.address)
    rude.send_multipart([HEADER, b"\x00" * (17 * 1024 * 1024)])
    assert rude.poll(1000) == 0
    rude.close()
    _check_valid(dealer)
    with EdgeClient(server.address, timeout_s=5) as c:
        stats = c.stats()
        assert c.health()["ready"] is True
    assert server.proc.poll() is None
    assert stats["requests"]["invalid"] >= 12_000
    assert sum(e["count"] for e in stats["errors"]) >= 12_000
    # every family of refusal was exercised
    assert {1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1010} <= set(codes)
    growth_mib = (rss1 - rss0) / 1024
    print(f"fuzz: 10000 messages in {elapsed:.1f} s, RSS {rss0 / 1024:.1f} -> {rss1 / 1024:.1f} MiB, codes {codes}")
    assert growth_mib < 16, f"RSS grew {growth_mib:.1f} MiB over 10k malformed messages"


def test_idle_cpu_below_one_percent(server):
    with EdgeClient(server.address, timeout_s=5) as c:
        for _ in range(20):
            c.embed(["warm up the loop", "two"])
        wait_until(lambda: c.stats()["queue"]["in_flight"] == 0, 5, "the server to hold no request")
    cpu0, t0 = server.cpu_s(), time.monotonic()
    time.sleep(3.0)
    cpu1, t1 = server.cpu_s(), time.monotonic()
    share = (cpu1 - cpu0) / (t1 - t0)
    print(f"idle CPU: {share * 100:.2f}% ({cpu1 - cpu0:.2f} s over {t1 - t0:.1f} s)")
    assert share < 0.01


def test_cli_against_process(server):
    edge = shutil.which("edge", path=os.path.dirname(sys.executable)) or None
    cmd = [edge] if edge else [sys.executable, "-m", "edge.cli"]
    run = lambda *a: subprocess.run(cmd + list(a), capture_output=True, text=True, timeout=30)  # noqa: E731
    r = run("health", "--connect", server.address)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ready"] is True
    r = run("embed", "hello world", "second text here", "--connect", server.address, "--request-id", "cli-1",
            "--format", "reply")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["request_id"] == "cli-1" and out["token_counts"] == [4, 5]
    emb = np.array(out["embeddings"], dtype=np.float32)
    np.testing.assert_allclose(emb[0], expected_embedding(FakeTokenizer().encode("hello world").ids), rtol=1e-6)
    r = run("embed", " ", "--connect", server.address)
    assert r.returncode == 1 and json.loads(r.stdout)["error"]["name"] == "EMPTY_TEXT"
    r = run("stats", "--connect", server.address)
    assert r.returncode == 0 and json.loads(r.stdout)["timeline"] == {"ready_ms": 1.0}
    r = run("health", "--connect", f"ipc://{server.dir}/nobody.sock", "--timeout", "0.3")
    assert r.returncode == 2 and "the socket file does not exist" in r.stderr and "Traceback" not in r.stderr


def test_sigterm_drains_every_request_then_exits():
    proc = ServerProcess("--sleep-ms", "30")  # 120 texts, 8 per batch: ~0.5 s of work in flight
    try:
        with EdgeClient(proc.address, timeout_s=10) as c, EdgeClient(proc.address, timeout_s=10) as h:
            n = 60
            for i in range(n):
                c.send("infer", {"texts": [f"sig {i}", "other text"], "request_id": i})
            wait_until(lambda: h.stats()["requests"].get("infer", 0) == n, 10, f"the server to receive the {n} requests")
            proc.proc.send_signal(signal.SIGTERM)
            # the server is draining, still busy with the 60 requests
            wait_until(lambda: h.health()["state"] == "draining", 10, "the server to start draining")
            for i in range(n, n + 5):
                c.send("infer", {"texts": ["after"], "request_id": i})
            got = {}
            for _ in range(n + 5):
                r = c.recv(10)
                assert r.body["request_id"] not in got
                got[r.body["request_id"]] = r
            assert sorted(got) == list(range(n + 5))
            # OVERLOADED: one connection may hold only its share of the queue (docs/protocol.md, Scheduling)
            assert all(got[i].type == "infer" or got[i].body["code"] in (2003, ErrorCode.OVERLOADED) for i in got)
            assert any(got[i].type == "infer" for i in range(n))
            assert got[n + 4].body["code"] == 2003  # sent after SIGTERM: SHUTTING_DOWN
        assert proc.proc.wait(15) == 0
        assert not os.path.exists(proc.path)
    finally:
        proc.kill()
