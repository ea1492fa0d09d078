"""The HTTP stack of the gateway, chosen by measurement: aiohttp against uvicorn (h11, asyncio).

    python -m bench.http_stacks [--seconds 3]

Each stack serves one POST route answering a JSON body of the gateway's size (one 384-float
embedding, base64) in a process of its own. Measured: start (exec to the port answering),
idle RSS, then sequential keep-alive requests for --seconds: requests/s and p50.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import time

BODY = json.dumps({"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": "A" * 2048}]})
SERVERS = {
    "aiohttp": f"""
import sys
from aiohttp import web
async def h(request):
    await request.read()
    return web.Response(text={BODY!r}, content_type="application/json")
app = web.Application(); app.router.add_post("/v1/embeddings", h)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
""",
    "uvicorn+h11": f"""
import sys, uvicorn
BODY = {BODY!r}.encode()
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({{"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}})
    await send({{"type": "http.response.body", "body": BODY}})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), http="h11", loop="asyncio", log_level="warning",
            access_log=False, lifespan="off")
""",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(name: str, seconds: float) -> dict:
    port = _free_port()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", SERVERS[name], str(port)])
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError as exc:
                if proc.poll() is not None or time.perf_counter() - t0 > 30:
                    raise RuntimeError(f"{name} did not start") from exc
                time.sleep(0.005)
        start_ms = 1000 * (time.perf_counter() - t0)
        time.sleep(0.5)
        with open(f"/proc/{proc.pid}/status") as f:
            rss = next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:"))
        conn = http.client.HTTPConnection("127.0.0.1", port)
        times = []
        t_end = time.perf_counter() + seconds
        while time.perf_counter() < t_end:
            t = time.perf_counter()
            conn.request("POST", "/v1/embeddings", '{"input": "hello", "model": "m"}',
                         {"Content-Type": "application/json"})
            conn.getresponse().read()
            times.append(time.perf_counter() - t)
        return {"stack": name, "start_ms": round(start_ms, 1), "idle_rss_mib": round(rss / 1024, 1),
                "requests_per_s": round(len(times) / sum(times), 0), "p50_ms": round(1000 * statistics.median(times), 3)}
    finally:
        proc.terminate()
        proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.http_stacks", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="sequential requests for this long, per stack (s)")
    args = ap.parse_args(argv)
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    for name in SERVERS:
        r = measure(name, args.seconds)
        print(f"{r['stack']:12} start {r['start_ms']:7.1f} ms  idle RSS {r['idle_rss_mib']:6.1f} MiB  "
              f"{r['requests_per_s']:6.0f} req/s  p50 {r['p50_ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
