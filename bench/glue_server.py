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
from edge.ipc.validate import parse_request
from edge.system.notify import notify

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
        from edge.boot import lineage_of
        from edge.serving.metrics import Metrics

        self.lineage = lineage_of(pkg.manifest, self.engine)
        self.metrics = Metrics([self.max_len])  # the runtime's own counters, so both stats read alike
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
            mtype, msg = parse_request(rest)
        except P.ProtocolError as exc:
            self.metrics.received("invalid")
            return self.error(exc.code, exc.message, trace_id, encoding, exc.request_id)
        self.metrics.received(mtype)
        if mtype == "infer":
            return self.infer(msg, trace_id, encoding)
        queue = P.QueueInfo(texts=0, max_texts=1, tokens=0, max_queued_tokens=self.max_len, in_flight=0)
        if mtype == "health":
            self.metrics.replied("health")
            return P.HealthReply(ready=True, state="ready", uptime_s=round(time.monotonic() - self.metrics.started, 3),
                                 queue=queue, trace_id=trace_id).frames(encoding)
        if mtype == "stats":
            self.metrics.replied("stats")
            settings = P.ServingInfo(buckets=[self.max_len], batch_caps={str(self.max_len): P.Limits().max_texts},
                                     max_delay_ms=0.0, max_text_tokens=self.max_len, max_texts=P.Limits().max_texts,
                                     max_text_bytes=P.Limits().max_text_bytes, max_frame_bytes=P.Limits().max_frame_bytes)
            return P.StatsReply(metrics=self.metrics.snapshot(), state="ready", queue=queue, lineage=self.lineage,
                                settings=settings, timeline=None, trace_id=trace_id).frames(encoding)
        # cancel: nothing is ever queued here
        return self.error(ErrorCode.UNKNOWN_REQUEST_ID, "this server runs one request at a time; nothing to cancel",
                          trace_id, encoding, msg.request_id)

    def error(self, code: ErrorCode, message: str, trace_id: str, encoding: str, request_id) -> list:
        self.metrics.error(code)
        return P.encode_error(code, message, trace_id, encoding, request_id)

    def infer(self, msg: P.InferMsg, trace_id: str, encoding: str) -> list:
        arrival = time.monotonic()
        batch = self.tokenizer.encode_batch(msg.texts, self.max_len, self.max_len)  # (N, 256) int64 each
        if not msg.truncate and any(batch.truncated):
            return self.error(ErrorCode.TOO_MANY_TOKENS, f"a text is longer than {self.max_len} tokens",
                              trace_id, encoding, msg.request_id)
        self.metrics.accepted(len(msg.texts))
        start = time.monotonic()
        out = np.ascontiguousarray(self.engine.run(batch.input_ids, batch.attention_mask), dtype=P.EMBEDDING_DTYPE)  # (N, D)
        end = time.monotonic()
        n = len(msg.texts)
        queue_ms, compute_ms = (start - arrival) * 1000.0, (end - start) * 1000.0
        self.metrics.batch(self.max_len, n, n, self.max_len, sum(batch.token_counts), compute_ms)  # fixed (N, 256)
        self.metrics.replied("infer", queue_ms, (end - arrival) * 1000.0)
        result = P.InferResult(trace_id=trace_id, count=out.shape[0], dim=out.shape[1], token_counts=batch.token_counts,
                               buckets=[self.max_len] * n, truncated=batch.truncated, queue_ms=queue_ms,
                               compute_ms=compute_ms, lineage=self.lineage, request_id=msg.request_id)
        return result.frames(encoding, out.data)

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
