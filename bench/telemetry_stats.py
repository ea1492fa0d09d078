"""What device telemetry costs a ``stats`` request: the runtime with it off and on, side by side.

    python -m bench.telemetry_stats [--package DIR] [--requests 2000] [--burn-in 200]
                                    [--interval 2.0] [--json FILE]

Starts the runtime (``python -m edge.boot``) twice on ipc sockets, ``--telemetry-interval 0``
(off) and ``--telemetry-interval S`` (on), waits for the second one's first sample, then
times ``stats`` round trips (send to reply decoded, in this process) alternating between the
two servers, one request at a time, so drift on a noisy machine hits both alike. Prints
min/median/p95 per server, the difference of the medians (goal: on is at most 1 ms slower)
and the size of the telemetry in the reply; ``--json FILE`` writes the record. The sampler
itself runs every ``--interval`` s in the "on" server throughout, as in production.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

GOAL_MS = 1.0  # on may be this much slower than off (median)


def summary(ms: list[float]) -> dict:
    s = sorted(ms)
    pick = lambda q: round(s[min(len(s) - 1, int(q * len(s)))], 3)  # noqa: E731
    return {"n": len(s), "min_ms": round(s[0], 3), "p50_ms": pick(0.5), "p95_ms": pick(0.95)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.telemetry_stats", description=__doc__.split("\n\n")[0])
    p.add_argument("--package", help="model package directory (default: edge's default package)")
    p.add_argument("--requests", type=int, default=2000, help="measured stats requests per server (default 2000)")
    p.add_argument("--burn-in", type=int, default=200, help="stats requests per server first, not counted (default 200)")
    p.add_argument("--interval", type=float, default=2.0, metavar="SECONDS", help="the 'on' server's --telemetry-interval (default 2.0)")
    p.add_argument("--json", help="write the JSON record here")
    args = p.parse_args(argv)

    import msgpack

    from bench.serve_server import Server
    from edge.runtime.default_package import default_package_dir, ensure_default_package
    from edge.ipc.client import EdgeClient

    pkg_dir = Path(args.package) if args.package else ensure_default_package(default_package_dir())
    work = Path(tempfile.mkdtemp(prefix="bench-telemetry-"))
    servers = {}
    for name, interval in (("off", 0.0), ("on", args.interval)):
        servers[name] = Server(name, [sys.executable, "-m", "edge.boot", "--package", str(pkg_dir), "--engine",
                                      "onnxruntime", "--telemetry-interval", str(interval),
                                      "--timeline", str(work / f"{name}-timeline.json")], work / name)
    clients = {}
    try:
        for server in servers.values():
            server.wait_ready()
        clients = {name: EdgeClient(s.address, timeout_s=30) for name, s in servers.items()}
        deadline = time.monotonic() + 30
        while clients["on"].stats().get("telemetry", {}).get("samples", 0) < 1:
            if time.monotonic() > deadline:
                raise SystemExit("the 'on' server has no telemetry sample after 30 s")
            time.sleep(0.05)
        times: dict[str, list[float]] = {"off": [], "on": []}
        for i in range(args.burn_in + args.requests):
            for name in (("off", "on") if i % 2 else ("on", "off")):  # alternate who goes first
                t0 = time.perf_counter()
                body = clients[name].stats()
                dt = (time.perf_counter() - t0) * 1000.0
                if i >= args.burn_in:
                    times[name].append(dt)
        last_on = body if name == "on" else clients["on"].stats()
        telemetry = last_on.get("telemetry", {})
    finally:
        for c in clients.values():
            c.close()
        for server in servers.values():
            server.stop()
    record = {name: summary(ms) for name, ms in times.items()}
    record.update(goal_ms=GOAL_MS, interval_s=args.interval, requests=args.requests, burn_in=args.burn_in,
                  telemetry_bytes=len(msgpack.packb(telemetry)), telemetry_read_ms=telemetry.get("read_ms"),
                  telemetry_samples=telemetry.get("samples"))
    record["diff_p50_ms"] = round(record["on"]["p50_ms"] - record["off"]["p50_ms"], 3)
    record["pass"] = record["diff_p50_ms"] <= GOAL_MS
    print(f"stats round trip, {args.requests} requests per server after {args.burn_in} burn-in, alternating")
    for name in ("off", "on"):
        r = record[name]
        print(f"  telemetry {name:<3} min {r['min_ms']:7.3f} ms  p50 {r['p50_ms']:7.3f} ms  p95 {r['p95_ms']:7.3f} ms")
    print(f"  telemetry in the reply: {record['telemetry_bytes']} bytes (msgpack); one sample reads in "
          f"{record['telemetry_read_ms']} ms on the sampler's thread, every {args.interval:g} s")
    print(f"  verdict: on - off p50 = {record['diff_p50_ms']:+.3f} ms {'<=' if record['pass'] else '>'} "
          f"{GOAL_MS:g} ms: {'PASS' if record['pass'] else 'FAIL'}")
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    return 0 if record["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
