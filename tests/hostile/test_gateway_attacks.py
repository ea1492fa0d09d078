"""Hostile HTTP clients against `edge gateway` in front of a real runtime: a slow body, a slow
header (slowloris), a huge body (declared and chunked), a connection flood and malformed JSON.
Each gets a clear error (or its connection closed, for one that never finishes its headers),
the gateway keeps serving, and the runtime keeps answering its ZeroMQ clients: health's p99
round trip stays under 50 ms while the attacks run."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from edge.ipc.client import EdgeClient
from support.gateway_proc import start_gateway
from support.runtime_proc import running_runtime

BODY_TIMEOUT_S = 1.0
IDLE_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 64
MAX_BODY = 1 << 20


@pytest.fixture(scope="module")
def runtime(minilm_package, tmp_path_factory):
    with running_runtime(tmp_path_factory.mktemp("gwh-rt"), "--package", str(minilm_package), "--engine",
                       "onnxruntime", "--fallback", "off") as rt:
        yield rt


@pytest.fixture(scope="module")
def gateway(runtime, tmp_path_factory):
    gw = start_gateway(tmp_path_factory.mktemp("gwh"), runtime.address, "--body-timeout", str(BODY_TIMEOUT_S),
                       "--idle-timeout", str(IDLE_TIMEOUT_S), "--max-connections", str(MAX_CONNECTIONS),
                       "--max-body-bytes", str(MAX_BODY))
    try:
        yield gw
    finally:
        assert gw.stop() == 0, gw.output()


class HealthProbe:
    """Health round trips to the runtime over ZeroMQ, every 20 ms, on a thread."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.rtts: list[float] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with EdgeClient(self.address, timeout_s=5) as c:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                assert c.health()["ready"]
                self.rtts.append(time.perf_counter() - t0)
                self._stop.wait(0.02)

    def __enter__(self) -> "HealthProbe":
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join(10)

    def p99_ms(self) -> float:
        r = sorted(self.rtts)
        return 1000 * r[min(len(r) - 1, int(0.99 * len(r)))]


def _connect(gw) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    return s


def _response(s: socket.socket, timeout_s: float = 10, raw: bool = False) -> tuple[int, dict, dict]:
    """Status, headers, JSON body (``raw``: the bytes) of one response (Content-Length framed)."""
    s.settimeout(timeout_s)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, f"closed before a response: {buf!r}"
        buf += chunk
    head, body = buf.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    n = int(headers.get("content-length", 0))
    while len(body) < n:
        chunk = s.recv(65536)
        assert chunk
        body += chunk
    if raw:
        return int(lines[0].split()[1]), headers, body[:n]
    return int(lines[0].split()[1]), headers, json.loads(body[:n]) if n else {}


def _open_connections(s: socket.socket) -> int:
    """The gateway's own count of open connections, asked on the keep-alive connection ``s``."""
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    _, _, text = _response(s, raw=True)
    (line,) = [ln for ln in text.decode().splitlines() if ln.startswith("edge_gateway_connections_open ")]
    return int(line.split()[1])


def _request(path: str, body: bytes, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def _closed(s: socket.socket, timeout_s: float) -> bool:
    s.settimeout(timeout_s)
    try:
        while s.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def _still_serves(gw) -> None:
    s = _connect(gw)
    s.sendall(_request("/v1/embeddings", b'{"input": "still here", "model": "m"}'))
    status, headers, body = _response(s)
    s.close()
    assert status == 200 and len(body["data"][0]["embedding"]) == 384 and headers["x-trace-id"]


def test_attacks_get_clear_errors_and_the_runtime_keeps_serving(gateway, runtime):
    with HealthProbe(runtime.address) as probe:
        # Malformed JSON, wrong types, token arrays: 400 in OpenAI's shape; 400/422 in TEI's.
        for path, raw, status in [("/v1/embeddings", b'{"input": ', 400), ("/v1/embeddings", b'[1, 2]', 400),
                                  ("/v1/embeddings", b'{"input": [[1, 2, 3]]}', 400),
                                  ("/v1/embeddings", b'{"input": "\xff\xfe"}', 400),
                                  ("/embed", b'{"inputs": 5}', 422), ("/embed", b'not json', 400)]:
            s = _connect(gateway)
            s.sendall(_request(path, raw))
            got, headers, body = _response(s)
            s.close()
            assert got == status and headers["x-trace-id"], (path, raw, got, body)
            assert (body["error"]["trace_id"] if path.startswith("/v1") else body["trace_id"]) == headers["x-trace-id"]

        # A huge body, declared: 413 before it is read; sent chunked: 413 once past the limit.
        s = _connect(gateway)
        s.sendall(f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: {64 << 20}\r\n\r\n".encode())
        got, _, body = _response(s)
        assert got == 413 and "over the limit" in body["error"]["message"]
        s.close()
        s = _connect(gateway)
        s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"a" * 65536
        try:
            for _ in range(2 * MAX_BODY // len(chunk)):
                s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        got, _, body = _response(s)
        assert got == 413
        s.close()

        # A slow body: half of it, then nothing: 408 after --body-timeout.
        s = _connect(gateway)
        raw = _request("/v1/embeddings", b'{"input": "slow body", "model": "m"}')
        s.sendall(raw[:-10])
        t0 = time.monotonic()
        got, _, body = _response(s, timeout_s=BODY_TIMEOUT_S + 10)
        assert got == 408 and "not received within" in body["error"]["message"]
        assert time.monotonic() - t0 >= BODY_TIMEOUT_S * 0.9
        s.close()

        # Slowloris: headers that never finish; the connection is closed after --idle-timeout.
        s = _connect(gateway)
        s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n")
        for _ in range(3):
            time.sleep(IDLE_TIMEOUT_S / 4)  # trickle, as a slowloris does
            try:
                s.sendall(b"X-A: b\r\n")
            except OSError:
                break
        assert _closed(s, IDLE_TIMEOUT_S + 10)
        s.close()

        # A connection flood: past --max-connections each new one gets 503 and is closed.
        held = [_connect(gateway) for _ in range(MAX_CONNECTIONS - 1)]
        watcher = _connect(gateway)  # the last one the cap allows, kept to read the count
        held.append(watcher)
        try:
            deadline = time.monotonic() + 10
            while _open_connections(watcher) < MAX_CONNECTIONS:  # every held one accepted
                assert time.monotonic() < deadline
            over = [_connect(gateway) for _ in range(20)]
            refused = 0
            for s in over:
                got, headers, body = _response(s)
                refused += got == 503 and headers.get("retry-after") == "1"
                s.close()
            assert refused == 20
        finally:
            for s in held:
                s.close()
        # Once the flood is gone, connections are served again (the cap counts live ones only).
        deadline = time.monotonic() + 10
        while True:
            try:
                _still_serves(gateway)
                break
            except AssertionError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
    assert len(probe.rtts) > 20 and probe.p99_ms() <= 50, (len(probe.rtts), probe.p99_ms())
    with EdgeClient(runtime.address, timeout_s=10) as c:
        assert c.embed(["the runtime still embeds"]).embeddings.shape == (1, 384)
