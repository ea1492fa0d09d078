"""The gateway's overhead, side by side with the ZeroMQ client against one runtime in one run.

    python -m bench.gateway --package DIR [--requests 300] [--seconds 5] [--concurrency 8]

1. One text per request, sequential: p50 of the ZeroMQ client (EdgeClient) and of HTTP
   (POST /v1/embeddings, keep-alive, base64 as the openai package asks), in interleaved blocks
   after a burn-in. Goal: the gateway adds <= 2 ms to the p50.
2. Saturation: --concurrency threads each sending requests of the text mix (8 texts) for
   --seconds, over ZeroMQ (one client per thread) and over HTTP (one connection per thread).
   Goal: HTTP >= 0.9x the ZeroMQ client's texts/s.
Prints one summary line with ok/MISSED and writes the JSON record with --json.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from edge.ipc.client import EdgeClient
from edge.system.readiness import NotifiedProcess

MIX = ["The conveyor belt stopped at 14:02 after the sensor reported a jam.", "hello world",
       "Replace the filter every 500 hours of operation or when the pressure drop exceeds 0.3 bar.",
       "Der Sensor meldet eine Übertemperatur.", "pump 3 vibration high", "What is the torque spec for M8 bolts?",
       "Shift handover: line 2 ran at 94% OEE, two micro-stops, no quality holds.", "ok"]


def _http_embed(conn: http.client.HTTPConnection, texts: list[str]) -> None:
    conn.request("POST", "/v1/embeddings", json.dumps({"input": texts, "model": "m", "encoding_format": "base64"}),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    body = r.read()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {body[:200]!r}")


def _p50_ms(call, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def _saturate(make, seconds: float, threads: int) -> float:
    """texts/s of ``threads`` loops, each ``make()`` -> a function sending one request of MIX."""
    counts = [0] * threads
    stop = time.monotonic() + seconds

    def loop(i: int) -> None:
        send = make()
        while time.monotonic() < stop:
            send()
            counts[i] += len(MIX)

    ts = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(counts) / (time.monotonic() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gateway", description=__doc__.split("\n\n")[0])
    ap.add_argument("--package", required=True, help="the model package directory")
    ap.add_argument("--requests", type=int, default=300, help="one-text requests per client, after burn-in")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each saturation run (s)")
    ap.add_argument("--concurrency", type=int, default=8, help="client threads at saturation")
    ap.add_argument("--json", default=None, help="write the record here")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="edge-bench-gw-"))
    address = f"ipc://{work}/edge.sock"
    rt = NotifiedProcess([sys.executable, "-m", "edge.boot", "--package", args.package, "--engine", "onnxruntime",
                          "--fallback", "off", "--bind", address], notify_path=work / "rt.notify",
                         log_path=work / "rt.log")
    gw = None
    try:
        rt.wait_ready(120)
        gw = NotifiedProcess([sys.executable, "-m", "edge.gateway.main", "--connect", address, "--listen",
                              "127.0.0.1:0"], notify_path=work / "gw.notify", log_path=work / "gw.log")
        gw.wait_ready(30)
        port = next(json.loads(ln)["listen"] for ln in gw.output(None).splitlines() if "gateway.ready" in ln)
        port = int(port.rsplit(":", 1)[1])
        zc = EdgeClient(address, timeout_s=30)
        hc = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for _ in range(50):  # burn-in
            zc.embed([MIX[1]])
            _http_embed(hc, [MIX[1]])
        zmq_p50, http_p50 = [], []
        for _ in range(3):  # interleaved blocks
            zmq_p50.append(_p50_ms(lambda: zc.embed([MIX[1]]), args.requests // 3))
            http_p50.append(_p50_ms(lambda: _http_embed(hc, [MIX[1]]), args.requests // 3))
        zp, hp = statistics.median(zmq_p50), statistics.median(http_p50)

        def make_zmq():
            c = EdgeClient(address, timeout_s=30)
            return lambda: c.embed(MIX)

        def make_http():
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            return lambda: _http_embed(c, MIX)

        zt = _saturate(make_zmq, args.seconds, args.concurrency)
        ht = _saturate(make_http, args.seconds, args.concurrency)
        zt2 = _saturate(make_zmq, args.seconds, args.concurrency)  # the runtime's rate drifts: bracket it
        ht2 = _saturate(make_http, args.seconds, args.concurrency)
        zt, ht = (zt + zt2) / 2, (ht + ht2) / 2
        added, ratio = hp - zp, ht / zt
        record = {"zmq_p50_ms": round(zp, 3), "http_p50_ms": round(hp, 3), "added_p50_ms": round(added, 3),
                  "zmq_texts_per_s": round(zt, 1), "http_texts_per_s": round(ht, 1), "ratio": round(ratio, 3),
                  "concurrency": args.concurrency, "texts_per_request": len(MIX),
                  "p50_ok": added <= 2.0, "ratio_ok": ratio >= 0.9}
        print(f"gateway: p50 one text zmq {zp:.2f} ms, http {hp:.2f} ms, added {added:+.2f} ms "
              f"({'ok' if added <= 2.0 else 'MISSED'} <= 2 ms); saturation x{args.concurrency}: zmq {zt:.0f} texts/s, "
              f"http {ht:.0f} texts/s, ratio {ratio:.3f} ({'ok' if ratio >= 0.9 else 'MISSED'} >= 0.9)")
        if args.json:
            Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
        return 0 if record["p50_ok"] and record["ratio_ok"] else 1
    finally:
        if gw is not None:
            gw.stop()
        rt.stop()


if __name__ == "__main__":
    sys.exit(main())
