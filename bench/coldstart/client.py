"""The benchmark's client: one DEALER socket that asks for the first reply and checks it.

It is deliberately lean (pyzmq + msgpack, no numpy, no ``edge`` import): a live process
keeps the pages it maps resident, so whatever the benchmark itself maps stays warm in a
cold-cache run. It connects right after the exec, before the runtime has bound (a ZeroMQ
ipc connect retries every ``RECONNECT_IVL``), and queues its request at once.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import msgpack
import zmq

from bench.coldstart.launch import MIN_COSINE, RunFailed, cosine, decode_f32le, log_tail, now_ns

__all__ = ["RECONNECT_IVL_MS", "Client", "embed_and_check"]

RECONNECT_IVL_MS = 5  # connect retry period while the runtime has not bound yet
POLL_MS = 20  # how often we look whether the child died while waiting (a reply ends the wait at once)
NOT_READY = "NOT_READY"  # error name of a request that reached a server still booting (docs/protocol.md)
RETRY_S = 0.002  # pause before asking again after NOT_READY


class Client:
    """One DEALER socket with a short reconnect interval; msgpack frames per docs/protocol.md."""

    def __init__(self, address: str) -> None:
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
        self.sock.setsockopt(zmq.RECONNECT_IVL_MAX, 0)  # no back-off: keep retrying every 5 ms
        self.sock.connect(address)

    def send(self, mtype: str, body: dict) -> None:
        # With ZMQ_IMMEDIATE off (the default) the message waits in the pipe until the peer exists.
        self.sock.send_multipart([msgpack.packb({"v": 1, "type": mtype}), msgpack.packb(body)])

    def wait(self, proc: subprocess.Popen | None, deadline_ns: int, log: Path | None) -> tuple[dict, dict, list]:
        while True:
            if self.sock.poll(POLL_MS, zmq.POLLIN):
                frames = self.sock.recv_multipart()
                return msgpack.unpackb(frames[0]), msgpack.unpackb(frames[1]), frames[2:]
            if proc is not None and proc.poll() is not None:
                raise RunFailed(f"process exited {proc.returncode} before replying:\n{log_tail(log) if log else ''}")
            if now_ns() > deadline_ns:
                raise RunFailed(f"no reply within the timeout:\n{log_tail(log) if log else ''}")

    def request(self, mtype: str, body: dict, timeout_s: float = 10.0) -> dict:
        self.send(mtype, body)
        header, body, _ = self.wait(None, now_ns() + int(timeout_s * 1e9), None)
        if header.get("type") == "error":
            raise RunFailed(f"{mtype} answered with an error: {body}")
        return body

    def close(self) -> None:
        self.sock.close(0)


def embed_and_check(client: Client, proc, text: str, reference, deadline_ns: int, log: Path) -> tuple[int, dict, float]:
    """Send one infer, wait for the reply, check it; returns (end_ns, reply body, cosine).

    A server that has started its loop but not yet switched to ready answers ``NOT_READY``
    (recoverable): like any client we ask again, and the clock runs on. Any other error, or a
    wrong embedding, fails the run.
    """
    retries = 0
    while True:
        client.send("infer", {"texts": [text], "request_id": 1 + retries})
        header, body, extra = client.wait(proc, deadline_ns, log)
        if header.get("type") == "error" and body.get("name") == NOT_READY and now_ns() < deadline_ns:
            retries += 1
            time.sleep(RETRY_S)
            continue
        break
    if header.get("type") == "error":
        raise RunFailed(f"first reply is an error: {body}\n{log_tail(log)}")
    body = {**body, "not_ready_retries": retries}
    if len(extra) != 1 or body.get("count") != 1:
        raise RunFailed(f"infer reply has {len(extra)} embedding frames, count {body.get('count')}")
    emb = decode_f32le(extra[0])
    cos = cosine(emb, reference)
    end = now_ns()
    if not cos >= MIN_COSINE:
        raise RunFailed(f"first reply is wrong: cosine {cos:.6f} to the reference < {MIN_COSINE}")
    return end, body, cos
