"""Exec to first reply: the bundle under runc vs the same runtime as a plain process.

    python -m image.bundle.measure --bundle DIR [--runs 10] [--json FILE]

Each run starts the runtime (``runc run --bundle DIR <id>``, or ``python -m edge.boot`` with
the bundle's package source and engine), with a client already connected and one ``infer``
request already queued: the clock runs from just before the exec to the reply. The
container is deleted (not timed) between runs. Runs alternate between the two so drift
on this noisy machine hits both alike. One line of summary, and a JSON record.
(The full cold-start study, with evicted page cache and phases, is ``edge-coldstart``.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import zmq

from edge.ipc import protocol as P
from edge.runtime.launch import boot_argv, compile_bytecode
from edge.system.readiness import stop_process
from edge.system.socket_dir import ipc_socket_name, prepare_host_dirs, prepare_socket_dir

__all__ = ["first_reply_s", "main"]

TEXT = "How long from exec to the first embedding?"
DEADLINE_S = 120.0


def first_reply_s(cmd: list[str], address: str, env: dict[str, str], stop) -> float:
    """Seconds from exec of ``cmd`` to the reply of an infer request sent at once to ``address``."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, 5)  # ms; the default 100 ms would dominate the figure
    sock.connect(address)
    sock.send_multipart(P.encode_request("infer", {"texts": [TEXT]}))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        if not sock.poll(int(DEADLINE_S * 1000)):
            raise TimeoutError(f"no reply within {DEADLINE_S} s from {' '.join(cmd)}")
        elapsed = time.perf_counter() - t0
        reply = P.decode_reply(sock.recv_multipart())
        if reply.is_error:
            raise RuntimeError(f"error reply: {reply.body}")
        return elapsed
    finally:
        sock.close()
        stop(proc)


def _summary(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"runs": len(xs), "min_s": round(xs[0], 4), "median_s": round(statistics.median(xs), 4),
            "p95_s": round(xs[min(len(xs) - 1, int(round(0.95 * (len(xs) - 1))))], 4), "all_s": [round(x, 4) for x in xs]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m image.bundle.measure", description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--runc", default="runc")
    ap.add_argument("--json", type=Path, default=None, help="write the record here")
    args = ap.parse_args(argv)
    meta = json.loads((args.bundle / "edge-bundle.json").read_text())
    # As edge-supervise prepares it (edge/system/socket_dir.py): owner, 0750, root's leftovers removed.
    prepare_socket_dir(meta["socket_dir"], meta["user"]["uid"], meta["user"]["gid"],
                       socket_name=ipc_socket_name(meta["address"]) or "edge.sock")
    prepare_host_dirs(meta["user"]["uid"], meta["user"]["gid"], meta.get("metrics_dir"), meta.get("state_dir"))

    def stop_container(cid):
        def runc_term(_proc):  # the child is runc run: the container's init gets the TERM through runc
            subprocess.run([args.runc, "kill", cid, "TERM"], capture_output=True)

        def stop(proc):
            try:
                stop_process(proc, 30.0, terminate=runc_term)
            finally:
                subprocess.run([args.runc, "delete", "--force", cid], capture_output=True)
        return stop

    compile_bytecode()  # the bundle's byte code is compiled; give the plain process the same
    work = Path(tempfile.mkdtemp(prefix="edge-measure-"))
    (work / "home").mkdir()
    plain_addr = f"ipc://{work}/run/edge.sock"
    plain_cmd = [*boot_argv(), "--package", meta["package"]["source"], "--engine", meta["engine"],
                 "--bind", plain_addr]
    config_env = dict(e.split("=", 1) for e in json.loads((args.bundle / "config.json").read_text())["process"]["env"])
    plain_env = {**os.environ, **{k: v for k, v in config_env.items() if k != "PATH"}, "HOME": str(work / "home")}
    plain_env.pop("NOTIFY_SOCKET", None)
    runc_env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    results: dict[str, list[float]] = {"runc": [], "plain": []}
    for i in range(args.runs):
        cid = f"edge-measure-{uuid.uuid4().hex[:8]}"
        results["runc"].append(first_reply_s([args.runc, "run", "--bundle", str(args.bundle), cid], meta["address"],
                                             runc_env, stop_container(cid)))
        results["plain"].append(first_reply_s(plain_cmd, plain_addr, plain_env, stop_process))
        print(f"run {i + 1}/{args.runs}: runc {results['runc'][-1]:.3f} s, plain {results['plain'][-1]:.3f} s",
              file=sys.stderr)
    record = {"bundle": str(args.bundle), "engine": meta["engine"], "host": os.uname().nodename,
              "runc": _summary(results["runc"]), "plain": _summary(results["plain"])}
    record["ratio_median"] = round(record["runc"]["median_s"] / record["plain"]["median_s"], 3)
    print(f"exec to first reply, median of {args.runs}: runc {record['runc']['median_s']:.3f} s, "
          f"plain {record['plain']['median_s']:.3f} s (x{record['ratio_median']})")
    if args.json:
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
