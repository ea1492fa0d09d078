"""Issue 28, item 3: the C++ client (clients/cpp) against the real runtime (MiniLM, ONNX Runtime).

The example program, built with CMake once per module, embeds texts (non-ASCII included) and
gets the Python client's embeddings; reads the health; an invalid input (a text over 32768
bytes, a blank text, 65 texts) and an overload (its own connection past its share of the queue)
arrive as their codes, with the exit status of the code's class; with no server it times out
after its retries instead of hanging, and the same client object then gets its reply from a
server started later (lazy pirate). Against a scripted server: a reply to an id not in flight,
and a late reply arriving on the retry's connection, are never taken for the request's."""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import threading
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

from edge.errors import ErrorCode
from edge.ipc.client import EdgeClient
from support.runtime_proc import running_runtime, start_runtime

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "clients" / "cpp"
COS_MIN = 0.9999
TEXTS = [
    "the conveyor belt sensor reports a jam",
    "ein Förderband läuft über die Rollen",
    "コンベヤーのセンサーが詰まりを報告した",
    "Ça coûte 12 € — naïve café 🚀",
    "Датчик конвейера сообщает о заторе",
    "word " * 400,  # past 256 tokens: truncated
]


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    """clients/cpp built with CMake (warnings as errors); the path of edge-embed-cpp."""
    for tool in ("cmake", "c++"):
        assert shutil.which(tool), f"{tool} is not installed (the README's test command installs it)"
    build = tmp_path_factory.mktemp("cpp-build")
    for cmd, timeout in (
        (["cmake", "-S", str(SOURCE), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DEDGECLIENT_WERROR=ON"], 120),
        (["cmake", "--build", str(build)], 600),
    ):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    exe = build / "edge-embed-cpp"
    assert exe.is_file()
    return exe


@pytest.fixture(scope="module")
def runtime(minilm_package, tmp_path_factory):
    with running_runtime(tmp_path_factory.mktemp("cpp-rt"), "--package", str(minilm_package)) as rt:
        yield rt


def run(example: Path, *args: str, stdin: str | None = None, timeout: float = 120) -> tuple[int, list[dict]]:
    proc = subprocess.run([str(example), *args], input=stdin, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode != 64, proc.stderr  # usage
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    return proc.returncode, lines


def embeddings(lines: list[dict]) -> np.ndarray:
    assert [line["index"] for line in lines] == list(range(len(lines))), lines[:1]
    return np.array([line["embedding"] for line in lines], dtype=np.float32)


def cosines(a: np.ndarray, b: np.ndarray) -> list[float]:
    return [float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y))) for x, y in zip(a, b, strict=True)]


def test_embeddings_equal_the_python_clients(example, runtime):
    with EdgeClient(runtime.address, timeout_s=60) as py:
        want = py.embed(TEXTS)
    rc, lines = run(example, "--connect", runtime.address, "--timeout-ms", "60000", *TEXTS)
    assert rc == 0, lines
    got = embeddings(lines)
    assert got.shape == want.embeddings.shape == (len(TEXTS), 384)
    cos = cosines(got, want.embeddings)
    print("cos (argv):", [f"{c:.7f}" for c in cos], "max |diff|:", float(np.abs(got - want.embeddings).max()))
    assert min(cos) >= COS_MIN, cos
    assert [line["tokens"] for line in lines] == want.meta["token_counts"]
    # stdin, one text per line: the same
    rc, lines = run(example, "--connect", runtime.address, "--timeout-ms", "60000", stdin="\n".join(TEXTS) + "\n")
    assert rc == 0, lines
    cos = cosines(embeddings(lines), want.embeddings)
    print("cos (stdin):", [f"{c:.7f}" for c in cos])
    assert min(cos) >= COS_MIN, cos


def test_health(example, runtime):
    rc, lines = run(example, "--connect", runtime.address, "--health")
    assert rc == 0 and len(lines) == 1, lines
    h = lines[0]
    with EdgeClient(runtime.address, timeout_s=60) as py:
        want = py.health()
    assert (h["live"], h["ready"], h["state"]) == (True, True, "ready")
    assert h["queue"]["max_texts"] == want["queue"]["max_texts"] and len(h["trace_id"]) == 16


@pytest.mark.parametrize("texts, code", [
    (["a" * 32769], ErrorCode.TEXT_TOO_LONG),
    (["fine", "   "], ErrorCode.EMPTY_TEXT),
    ([f"text {n}" for n in range(65)], ErrorCode.TOO_MANY_TEXTS),
], ids=["text_too_long", "empty_text", "too_many_texts"])
def test_an_invalid_input_arrives_as_its_code(example, runtime, texts, code):
    rc, lines = run(example, "--connect", runtime.address, "--timeout-ms", "60000", "--", *texts)
    assert len(lines) == 1 and "error" in lines[0], lines
    err = lines[0]["error"]
    assert (err["code"], err["name"]) == (int(code), code.name), err
    assert rc == int(code) // 1000 == 1
    assert err["request_id"] == 1 and len(err["trace_id"]) == 16


def test_an_overload_arrives_as_overloaded(example, runtime):
    """40 requests of 64 texts at once on one connection: 2,560 texts against a share of 512
    (docs/protocol.md, "Overload is per connection"), so the server refuses the requests past
    the share with OVERLOADED; each request gets exactly one reply, matched by its id."""
    texts = [f"overload text {n}" for n in range(64)]
    rc, lines = run(example, "--connect", runtime.address, "--timeout-ms", "60000", "--repeat", "40", "--", *texts)
    assert sorted(line["request_id"] for line in lines) == list(range(1, 41)), lines
    ok = [line for line in lines if line.get("ok")]
    refused = [line["error"] for line in lines if "error" in line]
    assert ok and refused, lines
    assert all(line["count"] == 64 for line in ok)
    assert {(e["code"], e["name"]) for e in refused} == {(int(ErrorCode.OVERLOADED), "OVERLOADED")}, refused
    assert all(e["request_id"] == line["request_id"] for line in lines if "error" in line for e in [line["error"]])
    assert rc == int(ErrorCode.OVERLOADED) // 1000 == 2
    with EdgeClient(runtime.address, timeout_s=60) as py:  # the runtime serves on
        assert py.embed("after the overload").embeddings.shape == (1, 384)


def test_no_server_times_out_after_its_retries_then_the_same_client_reconnects(example, minilm_package,
                                                                                 tmp_path_factory):
    """A socket with no server: each call times out after 2 attempts of 300 ms, each on a new
    socket, and says so (no hang). A runtime started then at that address answers the same
    client object's next call, with the Python client's embedding."""
    workdir = tmp_path_factory.mktemp("cpp-late")
    address = f"ipc://{workdir}/run/edge.sock"  # where start_runtime binds
    proc = subprocess.Popen([str(example), "--connect", address, "--timeout-ms", "300", "--retries", "1",
                             "--until-ok", "300", TEXTS[1]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(json.loads(line)) for line in proc.stdout], daemon=True)
    reader.start()
    rt = None
    try:
        first = lines.get(timeout=60)  # a hang would never print it
        assert "timeout" in first, first
        assert (first["timeout"]["attempts"], first["timeout"]["timeout_ms"]) == (2, 300), first
        assert first["timeout"]["elapsed_ms"] >= 600, first
        rt = start_runtime(workdir, "--package", str(minilm_package))
        rt.wait_ready()
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
        with EdgeClient(address, timeout_s=60) as py:
            want = py.embed(TEXTS[1]).embeddings
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if rt is not None:
            rt.stop()
    reader.join(timeout=60)
    seen = [first] + [lines.get_nowait() for _ in range(lines.qsize())]
    assert "embedding" in seen[-1], seen
    assert all("timeout" in line or line.get("error", {}).get("name") == "NOT_READY" for line in seen[:-1]), seen
    cos = cosines(embeddings(seen[-1:]), want)
    print("cos (after reconnect):", cos, "calls that timed out first:", len(seen) - 1)
    assert min(cos) >= COS_MIN, cos


# ------------------------------------------------------------------ against a scripted server
#
# A ROUTER in this process plays the server, to send what the real one never does: replies to
# ids not in flight, and a late reply on the connection of the request's retry.


def _reply(request_id: int | None, values: list[float], mtype: str = "infer") -> list[bytes]:
    body = {"trace_id": "0123456789abcdef", "count": 1, "dim": len(values), "token_counts": [3]}
    if request_id is not None:
        body["request_id"] = request_id
    return [msgpack.packb({"v": 1, "type": mtype}), msgpack.packb(body), np.asarray(values, dtype="<f4").tobytes()]


def _scripted(address: str, script, deadline_s: float = 60.0) -> threading.Thread:
    """Run ``script(recv, send)`` on a ROUTER bound at ``address``: ``recv()`` is the next
    request as (routing id, header, body), ``send(routing_id, frames)`` replies."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.bind(address)

    def recv():
        assert sock.poll(int(deadline_s * 1000)), "the client sent nothing"
        rid, header, body = sock.recv_multipart()
        return rid, msgpack.unpackb(header), msgpack.unpackb(body)

    def run():
        try:
            script(recv, lambda rid, frames: sock.send_multipart([rid, *frames]))
        finally:
            sock.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_replies_to_other_ids_are_not_taken_for_the_request(example, tmp_path):
    address = f"ipc://{tmp_path}/scripted.sock"

    def script(recv, send):
        rid, header, body = recv()
        assert header == {"v": 1, "type": "infer"} and body == {"texts": ["hi"], "request_id": 1, "deadline_ms": 50.0}
        send(rid, _reply(999, [9, 9, 9, 9]))           # no such request: dropped
        send(rid, _reply(None, [8, 8, 8, 8], "health"))  # no health in flight: dropped
        send(rid, _reply(1, [0.5, -0.5, 0.5, 0.5]))     # docs/protocol.md's example reply

    t = _scripted(address, script)
    rc, lines = run(example, "--connect", address, "--timeout-ms", "60000", "--deadline-ms", "50", "hi")
    t.join(timeout=60)
    assert rc == 0 and [line["embedding"] for line in lines] == [[0.5, -0.5, 0.5, 0.5]], lines


def test_a_late_reply_is_never_the_answer_to_the_retry(example, tmp_path):
    """The first attempt's reply comes after its timeout, on the retry's connection: the client
    takes the retry's reply (request id 2), never the late one (id 1)."""
    address = f"ipc://{tmp_path}/scripted.sock"

    def script(recv, send):
        first, _, body1 = recv()
        second, _, body2 = recv()  # the retry, once the first attempt timed out: a new connection
        assert (body1["request_id"], body2["request_id"]) == (1, 2) and first != second
        send(first, _reply(1, [1, 0, 0, 0]))   # to the closed connection: ZeroMQ drops it
        send(second, _reply(1, [0, 1, 0, 0]))  # the late reply on the new connection: not id 2's
        send(second, _reply(2, [0, 0, 1, 0]))

    t = _scripted(address, script)
    rc, lines = run(example, "--connect", address, "--timeout-ms", "300", "--retries", "1", "hi")
    t.join(timeout=60)
    assert rc == 0 and [line["embedding"] for line in lines] == [[0, 0, 1, 0]], lines


def _error(request_id: int, code: int, name: str) -> list[bytes]:
    body = {"code": code, "name": name, "message": "server is shutting down", "trace_id": "0123456789abcdef",
            "request_id": request_id}
    return [msgpack.packb({"v": 1, "type": "error"}), msgpack.packb(body)]


def test_shutting_down_is_sent_again_once_on_a_new_connection(example, tmp_path):
    """An update's handover: the old runtime answers SHUTTING_DOWN, and the client sends the request
    again on a new connection (which reaches the runtime that holds the address now), once."""
    address = f"ipc://{tmp_path}/scripted.sock"

    def script(recv, send):
        first, _, body1 = recv()
        send(first, _error(body1["request_id"], 2003, "SHUTTING_DOWN"))
        second, _, body2 = recv()  # a new connection: the old one was closed
        assert first != second and (body1["request_id"], body2["request_id"]) == (1, 2)
        send(second, _reply(2, [0, 0, 0, 1]))

    t = _scripted(address, script)
    rc, lines = run(example, "--connect", address, "--timeout-ms", "60000", "hi")
    t.join(timeout=60)
    assert rc == 0 and [line["embedding"] for line in lines] == [[0, 0, 0, 1]], lines


def test_a_second_shutting_down_is_the_callers(example, tmp_path):
    address = f"ipc://{tmp_path}/scripted.sock"

    def script(recv, send):
        for _ in range(2):
            rid, _, body = recv()
            send(rid, _error(body["request_id"], 2003, "SHUTTING_DOWN"))

    t = _scripted(address, script)
    rc, lines = run(example, "--connect", address, "--timeout-ms", "60000", "hi")
    t.join(timeout=60)
    assert lines and lines[-1]["error"]["code"] == 2003 and rc != 0, (rc, lines)
