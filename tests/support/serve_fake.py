"""Run an IpcServer with the fake engine and tokenizer as its own process (real-socket tests).

    python -m support.serve_fake --bind ipc:///tmp/x/edge.sock [--sleep-ms 5]

with tests/ on PYTHONPATH (support.pythonpath.child_env; support.fake_server.ServerProcess starts it so).

Prints ``READY <pid>`` on stdout once serving; SIGTERM drains and exits 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from edge.ipc.protocol import Lineage
from edge.ipc.server import IpcServer
from edge.serving.core import ServingCore
from support.ipc_fakes import FakeEngine, FakeTokenizer

SERVING = {"buckets": [8, 16, 32, 64], "max_batch_size": 8, "max_batch_tokens": 256, "max_delay_ms": 2.0,
           "max_queue_requests": 256, "max_queue_tokens": 16384}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bind", required=True)
    ap.add_argument("--sleep-ms", type=float, default=0.0)
    ap.add_argument("--drain-timeout", type=float, default=10.0)
    args = ap.parse_args()
    core = ServingCore(FakeEngine(sleep_s=args.sleep_ms / 1000.0), FakeTokenizer(), SERVING, max_seq_length=64)
    lineage = Lineage(model_sha256="m" * 64, tokenizer_sha256="t" * 64, package_sha256="p" * 64)
    server = IpcServer(args.bind, core, lineage, timeline=lambda: {"ready_ms": 1.0},
                       drain_timeout_s=args.drain_timeout)
    server.bind()
    server.start()
    signal.signal(signal.SIGTERM, lambda *_: server.request_drain())
    print(f"READY {os.getpid()}", flush=True)
    while not server.wait(None):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
