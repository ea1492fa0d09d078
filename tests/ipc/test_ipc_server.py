"""In-process tier: an IpcServer on a real ipc:// socket, the fake engine and tokenizer."""

from __future__ import annotations

import errno
import os
import random
import stat
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq

from edge.errors import EdgeError, ErrorCode
from edge.ipc import protocol as P
from edge.ipc.client import EdgeClient
from edge.ipc.server import IpcServer, Lifecycle, default_bind_address
from edge.serving.core import ServingCore
from support.ipc_fakes import FakeEngine, FakeTokenizer, expected_embedding, text_of_tokens
from support.ipc_waits import wait_in_flight

E = ErrorCode
TOK = FakeTokenizer()


def expect(text: str) -> np.ndarray:
    return expected_embedding(TOK.encode(text, max_length=64).ids)


def collect(client: EdgeClient, n: int, timeout_s: float = 10.0) -> list[P.Reply]:
    return [client.recv(timeout_s) for _ in range(n)]


def by_rid(replies):
    out = {}
    for r in replies:
        rid = r.body.get("request_id")
        assert rid not in out, f"two replies for {rid}"
        out[rid] = r
    return out


def test_default_bind_address():
    assert default_bind_address({"XDG_RUNTIME_DIR": "/run/user/1000"}) == "ipc:///run/user/1000/edge/edge.sock"
    assert default_bind_address({}) == "ipc:///run/edge/edge.sock"
    assert default_bind_address({"EDGE_ADDRESS": "tcp://127.0.0.1:5555"}) == "tcp://127.0.0.1:5555"


def test_round_trip(make_server, make_client):
    server = make_server()
    assert server.state is Lifecycle.READY
    texts = ["hello world", text_of_tokens(12), text_of_tokens(40, "z")]
    for enc in (P.MSGPACK, P.JSON):
        r = make_client(server, encoding=enc).embed(texts, request_id="r-1")
        assert r.embeddings.shape == (3, 8) and r.embeddings.dtype == np.float32
        for row, t in zip(r.embeddings, texts):
            np.testing.assert_allclose(row, expect(t), rtol=1e-6, atol=1e-6)
        m = r.meta
        assert m["request_id"] == "r-1" and m["count"] == 3 and m["dim"] == 8
        assert m["token_counts"] == [4, 12, 40] and m["buckets"] == [8, 16, 64] and m["truncated"] == [False] * 3
        assert len(m["trace_id"]) == 16 and int(m["trace_id"], 16) >= 0
        assert m["model_sha256"] == "m" * 64 and m["tokenizer_sha256"] == "t" * 64 and m["package_sha256"] == "p" * 64
        assert m["engine"] == "fake" and m["device"] == "cpu"
        assert m["queue_ms"] >= 0 and m["compute_ms"] > 0


def test_socket_file_modes_and_removal(make_server, sock_dir):
    server = make_server()
    path = server.address[len("ipc://"):]
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o750
    assert stat.S_ISSOCK(os.stat(path).st_mode) and stat.S_IMODE(os.stat(path).st_mode) == 0o660
    # a second server on the same live socket refuses instead of stealing it
    other = IpcServer(server.address, ServingCore(FakeEngine(), TOK))
    with pytest.raises(OSError) as ei:
        other.bind()
    assert ei.value.errno == errno.EADDRINUSE
    other.request_drain()
    assert other.wait(1)  # never started: closes what it holds
    server.request_drain()
    assert server.wait(10) and server.state is Lifecycle.STOPPED
    assert not os.path.exists(path)


def test_stale_socket_file_is_replaced(make_server, make_client, sock_dir):
    import socket as pysocket

    os.makedirs(f"{sock_dir}/run", mode=0o750)
    stale = pysocket.socket(pysocket.AF_UNIX)
    stale.bind(f"{sock_dir}/run/edge.sock")
    stale.close()  # the file stays, nobody listens: what a killed server leaves
    server = make_server()
    assert make_client(server).health()["ready"] is True


def test_req_socket_and_tcp(make_server):
    server = make_server()
    ctx = zmq.Context.instance()
    req = ctx.socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    req.connect(server.address)
    req.send_multipart(P.encode_request("infer", {"texts": ["a b c"]}))
    assert req.poll(5000)
    r = P.decode_reply(req.recv_multipart())
    assert r.type == "infer" and len(r.extra) == 1
    np.testing.assert_allclose(P.embeddings_from_frame(r.extra[0], 1, 8)[0], expect("a b c"), rtol=1e-6)
    req.close()
    tcp = IpcServer("tcp://127.0.0.1:0", ServingCore(FakeEngine(), TOK, max_seq_length=64))
    tcp.bind()
    tcp.start()
    try:
        assert tcp.address.startswith("tcp://127.0.0.1:") and not tcp.address.endswith(":0")
        with EdgeClient(tcp.address, timeout_s=5) as c:
            assert c.embed("x y").embeddings.shape == (1, 8)
    finally:
        tcp.request_drain()
        assert tcp.wait(10)


def test_bucket_choice_padding_and_truncation(make_server, make_client):
    engine = FakeEngine()
    server = make_server(engine)
    c = make_client(server)
    lengths = [3, 8, 9, 16, 17, 64, 100]
    texts = [text_of_tokens(n) for n in lengths]
    r = c.embed(texts)
    assert r.meta["buckets"] == [8, 8, 16, 16, 32, 64, 64]
    assert r.meta["token_counts"] == [3, 8, 9, 16, 17, 64, 64]
    assert r.meta["truncated"] == [False] * 6 + [True]
    for row, t in zip(r.embeddings, texts):
        np.testing.assert_allclose(row, expect(t), rtol=1e-6, atol=1e-6)
    assert engine.padding_violations == 0
    # A CPU runs each batch at its longest text, within the bucket that grouped it: the 17-token
    # text is bucket 32's only one, so 17 columns, never 32; bucket 64's texts are 64 long.
    widths = {w for _, w in engine.calls}
    assert 17 in widths and 32 not in widths and 64 in widths and max(widths) <= 64, engine.calls
    assert all(rows <= 8 and rows * w <= 256 for rows, w in engine.calls)
    with pytest.raises(EdgeError) as ei:
        c.embed([text_of_tokens(65)], truncate=False)
    assert ei.value.code == E.TOO_MANY_TOKENS
    assert c.embed([text_of_tokens(64)], truncate=False).meta["truncated"] == [False]


def test_busy_engine_batches_waiting_requests(make_server, make_client):
    engine = FakeEngine()
    engine.device = "cuda:0"  # batches are padded to a warmed size on CUDA only
    server = make_server(engine, serving={"batch_sizes": [1, 2, 4, 8]})
    c = make_client(server)
    engine.release.clear()
    c.send("infer", {"texts": ["first"], "request_id": 0})
    assert engine.running.wait(5)
    for i in range(1, 12):  # 11 texts of bucket 8 queue up behind the running batch
        c.send("infer", {"texts": [f"t{i} x"], "request_id": i})
    wait_in_flight(server, 12)  # all 11 are queued before the engine is released
    # ... and tokenized: the tokenize stage hands them to the engine loop on its own thread, which
    # a busy machine delays; the loop, held in run(), takes them once the engine returns.
    deadline = time.monotonic() + 10
    while len(server.core.loop._intake) < 11:
        assert time.monotonic() < deadline, f"{len(server.core.loop._intake)} of 11 requests reached the engine loop"
        time.sleep(0.002)
    engine.release.set()
    replies = by_rid(collect(c, 12))
    assert sorted(replies) == list(range(12))
    for i in range(1, 12):
        np.testing.assert_allclose(P.embeddings_from_frame(replies[i].extra[0], 1, 8)[0], expect(f"t{i} x"), rtol=1e-6)
    # first alone, then a full batch of 8, then the 3 left padded up to the warmed size 4
    assert engine.calls == [(1, 8), (8, 8), (4, 8)]
    assert engine.padding_violations == 0
    stats = c.stats()
    assert stats["batches"]["sizes"] == {"1": 1, "3": 1, "8": 1}
    assert 0 < stats["batches"]["padding_efficiency"] < 1


def test_a_cpu_batch_runs_at_its_longest_text(make_server, make_client):
    """Two texts of bucket 16 (9 and 11 tokens) queued together run as one 2 x 11 batch, and the
    padding the stats count is of that shape (11 columns, not the bucket's 16)."""
    engine = FakeEngine()
    server = make_server(engine)
    c = make_client(server)
    engine.release.clear()
    c.send("infer", {"texts": ["first"], "request_id": 0})
    assert engine.running.wait(5)
    c.send("infer", {"texts": [text_of_tokens(9), text_of_tokens(11)], "request_id": 1})
    wait_in_flight(server, 2)
    engine.release.set()
    replies = by_rid(collect(c, 2))
    assert sorted(replies) == [0, 1] and replies[1].body["buckets"] == [16, 16]
    assert engine.calls[-1] == (2, 11) and engine.padding_violations == 0
    by_bucket = c.stats()["batches"]["by_bucket"]["16"]
    assert by_bucket["tokens"] == 20 and by_bucket["padded_tokens"] == 22


def test_a_cpu_batch_of_short_texts_and_one_long_runs_as_two_calls_and_answers_in_order(make_server, make_client):
    """Bucket 32: seven 17-token texts and one of 32 run as 7 x 17 and 1 x 32 (151 padded tokens,
    not 8 x 32 = 256: BatchShapes.groups), and each embedding is its own text's, where it was sent."""
    engine = FakeEngine()
    server = make_server(engine)
    c = make_client(server)
    texts = [text_of_tokens(17, word=f"s{i}x") for i in range(7)]
    texts.insert(3, text_of_tokens(32, word="long"))
    engine.release.clear()
    c.send("infer", {"texts": ["first"], "request_id": 0})
    assert engine.running.wait(5)
    c.send("infer", {"texts": texts, "request_id": 1})
    wait_in_flight(server, 2)
    engine.release.set()
    replies = by_rid(collect(c, 2))
    assert replies[1].body["buckets"] == [32] * 8
    assert engine.calls[-2:] == [(7, 17), (1, 32)] and engine.padding_violations == 0
    by_bucket = c.stats()["batches"]["by_bucket"]["32"]
    assert by_bucket["batches"] == 1 and by_bucket["tokens"] == 7 * 17 + 32 and by_bucket["padded_tokens"] == 151
    got = P.embeddings_from_frame(replies[1].extra[0], 8, replies[1].body["dim"])
    for i, text in enumerate(texts):  # each alone, the same engine
        ids = np.asarray([FakeTokenizer().encode(text).ids], dtype=np.int64)
        np.testing.assert_allclose(got[i], engine.run(ids, np.ones_like(ids))[0], rtol=1e-6)


class CostlyCallEngine(FakeEngine):
    """A call costs 10 ms of its own plus 0.05 ms a padded token: one more call is worth 200 tokens."""

    def run(self, input_ids, attention_mask):
        time.sleep(0.010 + 0.00005 * input_ids.size)
        return super().run(input_ids, attention_mask)


def test_the_engine_loop_learns_what_a_call_costs_and_cuts_batches_by_it(make_server, make_client):
    """The prior (8 tokens) would run 4 x 17 and 3 x 30; an engine whose calls cost 200 tokens each
    runs them as one 7 x 30 call, once the loop has timed enough calls of its own."""
    engine = CostlyCallEngine()
    server = make_server(engine)
    c = make_client(server)
    assert c.stats()["call_cost"] == {"tokens": 8.0, "learned": False, "calls": 0, "fixed_ms": None,
                                      "ms_per_token": None}
    for n in [3, 9, 17, 30, 50, 64] * 4:  # one text a request: one call each, of many sizes
        c.embed([text_of_tokens(n, word=f"t{n}x")])
    learned = c.stats()["call_cost"]
    assert learned["learned"] and learned["calls"] == 24, learned
    assert 60.0 < learned["tokens"] <= 256.0 and learned["fixed_ms"] >= 5.0, learned  # 200: sleep overshoots a little
    engine.release.clear()
    c.send("infer", {"texts": ["first"], "request_id": 0})
    assert engine.running.wait(5)
    c.send("infer", {"texts": [text_of_tokens(17, word=f"s{i}x") for i in range(4)]
                     + [text_of_tokens(30, word=f"l{i}x") for i in range(3)], "request_id": 1})
    wait_in_flight(server, 2)
    engine.release.set()
    by_rid(collect(c, 2))
    assert engine.calls[-1] == (7, 30), engine.calls[-3:]


def test_warmed_batch_padding_defaults_to_cuda_only(make_server):
    cpu = make_server(FakeEngine(), serving={"batch_sizes": [1, 2, 4, 8]}, name="cpu.sock")
    gpu_engine = FakeEngine()
    gpu_engine.device = "cuda:0"
    gpu = make_server(gpu_engine, serving={"batch_sizes": [1, 2, 4, 8]}, name="gpu.sock")
    assert cpu.core.shapes.padded_rows(3, 8) == 3
    rows = gpu.core.shapes.padded_rows
    assert rows(3, 8) == 4 and rows(5, 8) == 8 and rows(8, 8) == 8


def test_many_concurrent_clients(make_server):
    server = make_server(FakeEngine(sleep_s=0.001))
    n_clients, n_requests = 12, 25
    failures, answered = [], []

    def worker(k: int) -> None:
        rng = random.Random(k)
        try:
            with EdgeClient(server.address, timeout_s=20) as c:
                for i in range(n_requests):
                    texts = [text_of_tokens(rng.randint(3, 70), f"c{k}r{i}") for _ in range(rng.randint(1, 4))]
                    r = c.embed(texts, request_id=f"{k}-{i}", priority=rng.randint(0, 2))
                    assert r.meta["request_id"] == f"{k}-{i}"
                    for row, t in zip(r.embeddings, texts):
                        np.testing.assert_allclose(row, expect(t), rtol=1e-5, atol=1e-6)
                    answered.append(r.meta["request_id"])
        except Exception as exc:  # reported below with the client number
            failures.append((k, repr(exc)))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures, failures[:3]
    assert len(answered) == len(set(answered)) == n_clients * n_requests
    with EdgeClient(server.address, timeout_s=5) as c:
        s = c.stats()
    assert s["replies_ok"]["infer"] == n_clients * n_requests and s["errors_total"] == 0
    assert s["latency_ms"]["total"]["count"] == n_clients * n_requests
    assert max(int(k) for k in s["batches"]["sizes"]) > 1  # concurrency did form batches


def test_deadline_exceeded_before_running(make_server, make_client):
    engine = FakeEngine()
    server = make_server(engine)
    c = make_client(server)
    engine.release.clear()
    c.send("infer", {"texts": ["runs"], "request_id": "a"})
    assert engine.running.wait(5)
    c.send("infer", {"texts": ["waits", text_of_tokens(30)], "request_id": "b", "deadline_ms": 30})
    c.send("infer", {"texts": ["waits too"], "request_id": "c", "deadline_ms": 60_000})
    wait_in_flight(server, 3)  # b and c are queued behind a
    time.sleep(0.031)  # not ordering: b's 30 ms deadline counts from its arrival, before the line above returned
    engine.release.set()
    replies = by_rid(collect(c, 3))
    assert replies["a"].type == "infer" and replies["c"].type == "infer"
    assert replies["b"].is_error and replies["b"].body["code"] == E.DEADLINE_EXCEEDED
    assert replies["b"].body["name"] == "DEADLINE_EXCEEDED"
    assert all(shape[0] == 1 for shape in engine.calls)  # b never ran
    assert len(engine.calls) == 2


def test_cancel(make_server, make_client):
    engine = FakeEngine()
    server = make_server(engine)
    c = make_client(server)
    engine.release.clear()
    c.send("infer", {"texts": ["running"], "request_id": "a"})
    assert engine.running.wait(5)
    c.send("infer", {"texts": ["queued", "two"], "request_id": "b"})
    c.send("cancel", {"request_id": "b"})
    c.send("cancel", {"request_id": "a"})  # already running: not cancelled, still answered
    c.send("cancel", {"request_id": "nope"})
    # answered at once by the I/O thread, which has passed b and both cancels before it to the engine loop
    first = c.recv(5)
    # a cancel from another connection cannot touch this connection's requests
    other = make_client(server)
    with pytest.raises(EdgeError) as ei:
        other.cancel("a")
    assert ei.value.code == E.UNKNOWN_REQUEST_ID
    engine.release.set()
    replies = [first] + collect(c, 4)
    kinds = [(r.type, r.body.get("request_id"), r.body.get("code"), r.body.get("cancelled")) for r in replies]
    assert ("error", "nope", E.UNKNOWN_REQUEST_ID, None) in kinds
    assert ("error", "b", E.CANCELLED, None) in kinds
    assert ("cancel", "b", None, True) in kinds
    assert ("cancel", "a", None, False) in kinds
    assert ("infer", "a", None, None) in kinds
    assert len(engine.calls) == 1


def test_duplicate_request_id(make_server, make_client):
    engine = FakeEngine()
    server = make_server(engine)
    c1, c2 = make_client(server), make_client(server)
    engine.release.clear()
    c1.send("infer", {"texts": ["x"], "request_id": 5})
    assert engine.running.wait(5)
    c1.send("infer", {"texts": ["y"], "request_id": 5})
    c2.send("infer", {"texts": ["z"], "request_id": 5})  # same id, other connection: fine
    dup = c1.recv(5)
    assert dup.is_error and dup.body["code"] == E.DUPLICATE_REQUEST_ID and dup.body["request_id"] == 5
    engine.release.set()
    assert c1.recv(5).type == "infer" and c2.recv(5).type == "infer"


@pytest.mark.parametrize("bound", ["requests", "tokens"])
def test_overload_is_immediate_and_every_request_answered(make_server, make_client, bound):
    engine = FakeEngine()
    serving = {"max_queue_requests": 20} if bound == "requests" else {"max_queue_tokens": 20 * 16}
    server = make_server(engine, serving=serving)
    c = make_client(server)
    engine.release.clear()
    n = 60
    for i in range(n):
        c.send("infer", {"texts": [text_of_tokens(10, f"o{i}")], "request_id": i})  # bucket 16 each
    t0 = time.monotonic()
    early = []
    while len(early) < n - 20:  # overload replies come while the engine is still held
        early.append(c.recv(5))
    assert time.monotonic() - t0 < 3
    assert all(r.is_error and r.body["code"] == E.OVERLOADED for r in early)
    with EdgeClient(server.address, timeout_s=5) as h:
        assert h.health()["queue"]["requests"] == 20
    engine.release.set()
    late = collect(c, 20)
    replies = by_rid(early + late)
    assert sorted(replies) == list(range(n))
    assert all(r.type == "infer" for r in late)
    with pytest.raises(TimeoutError):
        c.recv(0.3)  # nothing more: exactly one reply each


def test_drain_answers_every_request_exactly_once(make_server, make_client):
    engine = FakeEngine(sleep_s=0.01)
    server = make_server(engine)
    c1, c2 = make_client(server), make_client(server)
    for i in range(30):
        (c1 if i % 2 else c2).send("infer", {"texts": [f"d{i} a b", text_of_tokens(20, f"d{i}")], "request_id": i})
    assert engine.running.wait(5)  # the drain begins with a batch in the engine
    server.request_drain()
    assert server.state is Lifecycle.DRAINING
    for i in range(30, 40):
        c1.send("infer", {"texts": ["late"], "request_id": i})
    got = by_rid(collect(c1, 15 + 10) + collect(c2, 15))
    assert sorted(got) == list(range(40))
    for i in range(30, 40):
        assert got[i].body["code"] == E.SHUTTING_DOWN
    # requests sent before the drain either ran or were refused as shutting down; none lost
    assert {r.type for i, r in got.items() if i < 30} <= {"infer", "error"}
    assert all(got[i].type == "infer" or got[i].body["code"] == E.SHUTTING_DOWN for i in range(30))
    assert server.wait(10) and server.state is Lifecycle.STOPPED
    for c in (c1, c2):
        with pytest.raises(TimeoutError):
            c.recv(0.2)


def test_drain_timeout_answers_stuck_requests(make_server, make_client):
    engine = FakeEngine()
    server = make_server(engine, drain_timeout_s=0.3)
    c = make_client(server)
    engine.release.clear()
    c.send("infer", {"texts": ["stuck"], "request_id": 1})
    c.send("infer", {"texts": ["behind"], "request_id": 2})
    assert engine.running.wait(5)
    server.request_drain()
    got = by_rid(collect(c, 2))
    assert all(r.body["code"] == E.SHUTTING_DOWN for r in got.values())
    assert server.wait(10)
    engine.release.set()  # let the stuck engine thread end


def test_engine_failure_is_an_error_reply_and_server_survives(make_server, make_client):
    bad_word = "boom"
    bad_id = TOK.encode(bad_word).ids[1]
    server = make_server(FakeEngine(fail_on=bad_id))
    c = make_client(server)
    with pytest.raises(EdgeError) as ei:
        c.embed(["fine", bad_word])
    assert ei.value.code == E.ENGINE_FAILED and ei.value.recoverable
    assert c.embed(["fine"]).embeddings.shape == (1, 8)
    s = c.stats()
    assert s["batches"]["engine_failures"] >= 1
    assert {"code": 3001, "name": "ENGINE_FAILED", "count": 1} in s["errors"]


class ShapeShiftingEngine(FakeEngine):
    """Returns one row too many on its second call: a broken engine, not a broken server."""

    def run(self, ids, mask):
        out = super().run(ids, mask)
        return np.vstack([out, out[:1]]) if len(self.calls) == 2 else out


def test_engine_output_of_wrong_shape_is_engine_failed(make_server, make_client):
    server = make_server(ShapeShiftingEngine())
    c = make_client(server)
    assert c.embed("one").embeddings.shape == (1, 8)
    with pytest.raises(EdgeError) as ei:
        c.embed("two")
    assert ei.value.code == E.ENGINE_FAILED and "shape" in ei.value.message
    assert c.embed("three").embeddings.shape == (1, 8)


def test_malformed_messages_get_error_replies(make_server):
    server = make_server()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.address)
    cases = [
        ([b"\xc1", b"\x80"], E.MALFORMED_FRAME, P.MSGPACK),
        ([b"only one frame"], E.WRONG_FRAME_COUNT, P.MSGPACK),
        (P.encode_request("health", {}) + [b"extra"], E.WRONG_FRAME_COUNT, P.MSGPACK),
        ([b'{"v":1,"type":"embed"}', b"{}"], E.UNKNOWN_TYPE, P.JSON),
        ([b'{"v":9,"type":"infer"}', b"{}"], E.UNSUPPORTED_VERSION, P.JSON),
        (P.encode_request("infer", {"texts": ["a"] * 65}), E.TOO_MANY_TEXTS, P.MSGPACK),
        ([b"\x82\xa1v\x01\xa4type\xa5infer", b"\x80" * (4 * 1024 * 1024 + 1)], E.FRAME_TOO_LARGE, P.MSGPACK),
    ]
    for frames, code, enc in cases:
        sock.send_multipart(frames)
        assert sock.poll(5000)
        reply = sock.recv_multipart()
        assert reply[0][:1] == (b"{" if enc == P.JSON else b"\x82")
        r = P.decode_reply(reply)
        assert r.is_error and r.body["code"] == code and r.body["name"] == code.name, (frames[:1], r.body)
    sock.close()


def test_health_not_ready_until_marked(make_server, make_client):
    server = make_server(start=False)
    server.bind()
    server.start(ready=False)
    c = make_client(server)
    h = c.health()
    assert h["live"] is True and h["ready"] is False and h["state"] == "booting"
    with pytest.raises(EdgeError) as ei:
        c.embed("x")
    assert ei.value.code == E.NOT_READY
    server.mark_ready()
    assert c.health()["ready"] is True and c.embed("x").embeddings.shape == (1, 8)


def test_stats_content(make_server, make_client):
    server = make_server(timeline=lambda: {"stages": [{"name": "import", "start_ms": 0, "end_ms": 12.5}], "ready_ms": 80.0})
    c = make_client(server)
    c.embed(["a b", text_of_tokens(20)])
    with pytest.raises(EdgeError):
        c.embed([""])
    s = c.stats()
    assert s["state"] == "ready" and s["lineage"]["model_sha256"] == "m" * 64
    assert s["timeline"]["ready_ms"] == 80.0
    # the empty text is refused while parsing: counted as an invalid message, not an infer
    assert s["requests"]["infer"] == 1 and s["requests"]["invalid"] == 1
    assert s["replies_ok"]["infer"] == 1 and s["texts_accepted"] == 2
    assert s["errors"] == [{"code": 1005, "name": "EMPTY_TEXT", "count": 1}]
    assert s["latency_ms"]["total"]["count"] == 1 and sum(s["latency_ms"]["compute"]["counts"]) == 2
    # the 20-token text runs alone in bucket 32: 20 columns on a CPU, all of them real
    assert s["batches"]["by_bucket"]["8"]["tokens"] == 4 and s["batches"]["by_bucket"]["32"]["padded_tokens"] == 20
    assert s["settings"]["buckets"] == [8, 16, 32, 64] and s["settings"]["batch_caps"]["64"] == 4
    assert s["queue"] == {"texts": 0, "max_texts": 64, "tokens": 0, "max_queued_tokens": 4096, "in_flight": 0,
                          "pending_text_bytes": 0, "max_pending_text_bytes": 32 << 20,
                          "by_bucket": {"8": 0, "16": 0, "32": 0, "64": 0},  # stats only: texts queued per bucket
                          "requests": 0, "max_requests": 64, "max_tokens": 4096}  # the last three: deprecated names
    assert "by_bucket" not in c.health()["queue"]
    assert s["settings"]["max_text_tokens"] == s["settings"]["max_tokens"] == 64  # MAX_SEQ of conftest
    # string keys only: a strict msgpack decoder (and JSON) reads it
    msgpack.unpackb(msgpack.packb(s), strict_map_key=True)
