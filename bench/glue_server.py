"""The "glue" baseline of the serve benchmark: the simplest server that speaks protocol v1.

    python -m bench.glue_server --package DIR --bind ipc://PATH [--engine onnxruntime] [--device auto]

What a team writes first when it wraps a model in a socket: one ROUTER socket, one loop,
one request at a time. Each request's texts are tokenized with the package's tokenizer,
padded to the model's maximum length (256 tokens), run through the same engine, and
answered. No batching across requests, no length buckets, no I/O thread. Messages are
parsed and encoded with ``edge.ipc.protocol``, so any v1 client (and the benchmark's load
generator) talks to it unchanged. It sends ``READY=1`` to ``$NOTIFY_SOCKET`` once warm.

``health`` and ``stats`` are answered (``stats`` with the padding counters of
docs/protocol.md: ``batches.padding_efficiency`` and ``batches.by_bucket``); ``cancel`` is
answered ``UNKNOWN_REQUEST_ID``, since nothing is ever queued in the process.
"""

from __future__ import annotations

import argparse
import secrets
import signal
import sys
import time
from pathlib import Path

import numpy as np
import zmq

from edge.errors import ErrorCode
from edge.ipc import protocol as P
from edge.notify import notify

PAD_TO = 256  # tokens: every request is padded to the model's maximum length


class GlueServer:
    def __init__(self, package: Path, engine: str, device: str, bind: str) -> None:
        from edge.engines import load_engine
        from edge.preload.manifest import open_package
        from edge.preload.tokenizer import Tokenizer

        pkg = open_package(package, verify="size")
        self.max_len = min(PAD_TO, pkg.manifest.max_seq_length)
        self.tokenizer = Tokenizer.open(pkg.path(pkg.manifest.tokenizer))
        self.engine = load_engine(pkg, engine, device)
        m = pkg.manifest
        self.lineage = {"model_sha256": m.model_sha256, "tokenizer_sha256": m.tokenizer_sha256,
                        "package_sha256": m.package_sha256, "engine": self.engine.name, "device": self.engine.device}
        self.started = time.monotonic()
        self.counts = {"infer": 0, "ok": 0, "errors": 0, "tokens": 0, "padded_tokens": 0, "batches": 0, "compute_ms": 0.0}
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(bind)
        self.stop = False

    def warm(self) -> None:
        batch = self.tokenizer.encode_batch(["warm up"], self.max_len, self.max_len)
        for _ in range(3):
            self.engine.run(batch.input_ids, batch.attention_mask)

    def serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while not self.stop:
            if not poller.poll(200):  # wake up now and then to see SIGTERM
                continue
            frames = self.sock.recv_multipart()
            identity, rest = frames[0], frames[1:]
            delim = bool(rest) and len(rest[0]) == 0
            if delim:
                rest = rest[1:]
            envelope = [identity, b""] if delim else [identity]
            self.sock.send_multipart(envelope + self.handle(rest))

    def handle(self, rest: list) -> list:
        trace_id = secrets.token_hex(8)
        encoding = P.sniff_encoding(rest[0]) if rest else P.MSGPACK
        try:
            mtype, msg = P.parse_request(rest)
        except P.ProtocolError as exc:
            self.counts["errors"] += 1
            return P.encode_error(exc.code, exc.message, trace_id, encoding, exc.request_id)
        if mtype == "infer":
            return self.infer(msg, trace_id, encoding)
        if mtype == "health":
            body = {"live": True, "ready": True, "state": "ready", "uptime_s": round(time.monotonic() - self.started, 3),
                    "queue": {"requests": 0, "tokens": 0, "in_flight": 0}, "trace_id": trace_id}
            return P.encode_reply("health", body, encoding)
        if mtype == "stats":
            c = self.counts
            body = {"uptime_s": round(time.monotonic() - self.started, 3), "state": "ready", "trace_id": trace_id,
                    "requests": {"infer": c["infer"]}, "replies_ok": {"infer": c["ok"]}, "errors_total": c["errors"],
                    "batches": {"count": c["batches"],
                                "padding_efficiency": round(c["tokens"] / c["padded_tokens"], 4) if c["padded_tokens"] else None,
                                "by_bucket": {str(self.max_len): {"batches": c["batches"], "texts": c["ok"], "tokens": c["tokens"],
                                                                  "padded_tokens": c["padded_tokens"]}}},
                    "latency_ms": {"compute": {"sum": round(c["compute_ms"], 3), "count": c["batches"]}},
                    "lineage": self.lineage}
            return P.encode_reply("stats", body, encoding)
        self.counts["errors"] += 1  # cancel: nothing is ever queued here
        return P.encode_error(ErrorCode.UNKNOWN_REQUEST_ID, "this server runs one request at a time; nothing to cancel",
                              trace_id, encoding, msg.request_id)

    def infer(self, msg: P.InferMsg, trace_id: str, encoding: str) -> list:
        arrival = time.monotonic()
        self.counts["infer"] += 1
        batch = self.tokenizer.encode_batch(msg.texts, self.max_len, self.max_len)  # (N, 256) int64 each
        if not msg.truncate and any(batch.truncated):
            self.counts["errors"] += 1
            return P.encode_error(ErrorCode.TOO_MANY_TOKENS, f"a text is longer than {self.max_len} tokens",
                                  trace_id, encoding, msg.request_id)
        start = time.monotonic()
        out = np.ascontiguousarray(self.engine.run(batch.input_ids, batch.attention_mask), dtype=P.EMBEDDING_DTYPE)  # (N, D)
        end = time.monotonic()
        n = len(msg.texts)
        self.counts["compute_ms"] += (end - start) * 1000.0
        self.counts.update(ok=self.counts["ok"] + 1, batches=self.counts["batches"] + 1,
                           tokens=self.counts["tokens"] + sum(batch.token_counts),
                           padded_tokens=self.counts["padded_tokens"] + n * self.max_len)
        body = {"trace_id": trace_id, "count": out.shape[0], "dim": out.shape[1], "token_counts": batch.token_counts,
                "buckets": [self.max_len] * n, "truncated": batch.truncated,
                "queue_ms": round((start - arrival) * 1000.0, 3), "compute_ms": round((end - start) * 1000.0, 3),
                **self.lineage}
        if msg.request_id is not None:
            body["request_id"] = msg.request_id
        return P.encode_reply("infer", body, encoding, (out.data,))

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()
        self.engine.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.glue_server", description=__doc__.split("\n\n")[0])
    p.add_argument("--package", required=True)
    p.add_argument("--bind", required=True, help="ZeroMQ address, e.g. ipc:///tmp/glue.sock")
    p.add_argument("--engine", default="onnxruntime", choices=("onnxruntime", "torchscript"))
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    args = p.parse_args(argv)
    server = GlueServer(Path(args.package), args.engine, args.device, args.bind)

    def on_signal(*_):
        server.stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.warm()
    notify("READY=1", f"STATUS=glue server on {args.bind}")
    try:
        server.serve()
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
