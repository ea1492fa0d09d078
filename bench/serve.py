"""Serve benchmark: the real runtime under load, against the engine's ceiling and a glue server.

    python -m bench.serve [--package DIR] [--engine onnxruntime|torchscript] [--device auto|cpu|cuda]
                          [--duration S] [--burn-in S] [--json FILE] [--quick]

One invocation measures, in this order, each on an otherwise idle runtime:

1. **ceiling**: the engine loaded in this process, fed ideal batches of the same text mix
   (texts sorted into the length buckets, full batches of each bucket's shape, cap from
   the package's ``serving`` settings), tokenization excluded. Texts/s of the mix =
   1 / sum over buckets of (share of the mix / texts per second of a full batch).
   Also the engine's own batch-1 latency at each bucket shape (the lone-request baseline).
2. **edge**: ``python -m edge.boot`` as a subprocess (READY from a NOTIFY_SOCKET we bind),
   then closed-loop load at concurrency 1, 8 and 32 (C threads, each with its own DEALER
   socket: send one single-text request, wait for the reply, repeat) and open-loop Poisson
   arrivals at 50 %, 80 % and 100 % of the best closed-loop throughput, latency counted from
   each request's *scheduled* send time (no coordinated omission).
3. **glue**: ``python -m bench.glue_server`` (one request at a time, padded to 256 tokens),
   the same closed-loop runs.

Each phase has a burn-in (its results dropped) and a measured window of ``--duration`` s.
Latency is per request, send to reply, in the load generator (min / p50 / p95 / p99 ms);
throughput is replies received in the window per second (one text per request, so texts/s).
Padding efficiency comes both from the server's ``stats`` (real tokens / tokens computed,
differenced over the phase) and from the replies (sum of token_counts / sum of buckets;
blind to padding rows). CPU seconds of the load generator and of the server are recorded
per phase, in cores: on a 2-core machine they compete.

Goals (the serving issue): saturation >= 0.85 x ceiling and >= 3 x glue; lone request
(concurrency 1 median) <= engine batch-1 latency + 2 ms; padding efficiency >= 0.75.
Prints a table and one summary line; ``--json FILE`` writes the record.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import zmq

from edge.ipc import protocol as P

GOALS = {"vs_ceiling": 0.85, "vs_glue": 3.0, "lone_overhead_ms": 2.0, "padding_efficiency": 0.75}
CONCURRENCY = (1, 8, 32)
OPEN_FRACTIONS = (0.5, 0.8, 1.0)  # of the best closed-loop throughput
READY_DEADLINE_S = 120.0  # torch import alone takes seconds here
REPLY_TIMEOUT_S = 60.0


def pct(xs, qs=(0, 50, 95, 99)) -> dict:
    if len(xs) == 0:
        return {f"p{q}" if q else "min": None for q in qs}
    a = np.asarray(xs, dtype=np.float64)
    return {("min" if q == 0 else f"p{q}"): round(float(np.percentile(a, q)), 3) for q in qs}


def cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system, all threads) of ``pid``, or of this process."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ processes


class Server:
    """A server subprocess that reports READY=1 on a NOTIFY_SOCKET we bind."""

    def __init__(self, name: str, cmd: list[str], workdir: Path) -> None:
        self.name, self.workdir = name, workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.address = f"ipc://{workdir}/{name}.sock"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(workdir / f"{name}-notify.sock"))
        self.notify.settimeout(0.2)
        self.log = workdir / f"{name}.log"
        env = {**os.environ, "NOTIFY_SOCKET": str(workdir / f"{name}-notify.sock"), "HOME": str(workdir)}
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([*cmd, "--bind", self.address], stdout=out, stderr=subprocess.STDOUT, env=env)
        self.started = time.monotonic()
        self.ready_s = None

    def wait_ready(self) -> float:
        end = time.monotonic() + READY_DEADLINE_S
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode} before READY:\n{self.log.read_text()[-3000:]}")
            try:
                if b"READY=1" in self.notify.recv(4096).split(b"\n"):
                    self.ready_s = time.monotonic() - self.started
                    return self.ready_s
            except TimeoutError:  # socket.timeout
                pass
        raise RuntimeError(f"{self.name}: no READY=1 within {READY_DEADLINE_S} s:\n{self.log.read_text()[-3000:]}")

    def stats(self) -> dict:
        from edge.ipc.client import EdgeClient

        with EdgeClient(self.address, timeout_s=30) as c:
            return c.stats()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.notify.close()


# ------------------------------------------------------------------ load generators


def _body(texts: list[str], i: int, rid: int) -> list[bytes]:
    return P.encode_request("infer", {"texts": [texts[i % len(texts)]], "request_id": rid})


def _decode(frames: list) -> tuple[bool, int, int, str | None]:
    r = P.decode_reply(frames)
    if r.is_error:
        return False, 0, 0, str(r.body.get("name"))
    return True, sum(r.body["token_counts"]), sum(r.body["buckets"]), None


def closed_loop(address: str, texts: list[str], concurrency: int, burn_s: float, dur_s: float) -> dict:
    """C threads, each: send one request, wait for its reply, repeat until the window ends."""
    ctx = zmq.Context.instance()
    counter = itertools.count()  # next() is atomic under the GIL: texts go out in mix order
    records: list[tuple] = []  # (sent, received, ok, tokens, padded)
    errors: Counter = Counter()
    lock = threading.Lock()
    go = threading.Barrier(concurrency + 1)
    t0: list[float] = []

    def worker() -> None:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(address)
        mine, errs = [], Counter()
        go.wait()
        end = t0[0] + burn_s + dur_s
        try:
            for rid in itertools.count():
                sent = time.perf_counter()
                if sent >= end:
                    break
                s.send_multipart(_body(texts, next(counter), rid))
                if not s.poll(int(REPLY_TIMEOUT_S * 1000)):
                    errs["TIMEOUT"] += 1
                    break
                frames = s.recv_multipart()
                got = time.perf_counter()
                ok, tokens, padded, err = _decode(frames)
                if err:
                    errs[err] += 1
                mine.append((sent, got, ok, tokens, padded))
        finally:
            s.close(0)
            with lock:
                records.extend(mine)
                errors.update(errs)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    c0 = cpu_s()
    t0.append(time.perf_counter())
    go.wait()
    for t in threads:
        t.join()
    return _window(records, errors, t0[0] + burn_s, dur_s, cpu_s() - c0, time.perf_counter() - t0[0])


def open_loop(address: str, texts: list[str], rate: float, burn_s: float, dur_s: float, seed: int, offset: int) -> dict:
    """Poisson arrivals at ``rate``/s from one thread and one DEALER socket; latency from the
    scheduled send time, so a late send (the generator or the socket busy) counts against the server."""
    rng = random.Random(seed)
    sched, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= burn_s + dur_s:
            break
        sched.append(t)
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, 0)
    s.setsockopt(zmq.RCVHWM, 0)
    s.connect(address)
    records, errors, pending, lags = [], Counter(), {}, []
    c0 = cpu_s()
    t0 = time.perf_counter() + 0.01
    nxt, drain_until = 0, None
    try:
        while nxt < len(sched) or pending:
            now = time.perf_counter()
            if nxt < len(sched) and now >= t0 + sched[nxt]:
                s.send_multipart(_body(texts, offset + nxt, nxt))
                pending[nxt] = t0 + sched[nxt]
                lags.append(time.perf_counter() - pending[nxt])
                nxt += 1
                continue
            if nxt >= len(sched):
                drain_until = drain_until or now + REPLY_TIMEOUT_S
                if now >= drain_until:
                    errors["TIMEOUT"] += len(pending)
                    break
                wait = drain_until - now
            else:
                wait = t0 + sched[nxt] - now
            if s.poll(max(0, int(wait * 1000))):  # ms; a late wake-up only delays a send, never hides it
                while True:
                    try:
                        frames = s.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    got = time.perf_counter()
                    r = P.decode_reply(frames)
                    rid = r.body.get("request_id")
                    if rid not in pending:
                        continue
                    ok, tokens, padded, err = _decode(frames)
                    if err:
                        errors[err] += 1
                    records.append((pending.pop(rid), got, ok, tokens, padded))
    finally:
        s.close(0)
    out = _window(records, errors, t0 + burn_s, dur_s, cpu_s() - c0, time.perf_counter() - t0)
    out.update(offered_per_s=round(rate, 2), send_lag_ms=pct(np.asarray(lags) * 1000.0, (50, 99, 100)))
    return out


def _window(records: list[tuple], errors: Counter, start: float, dur_s: float, client_cpu: float, wall: float) -> dict:
    """Throughput = replies received in [start, start + dur); latency = requests sent in it."""
    end = start + dur_s
    done = [r for r in records if start <= r[1] < end and r[2]]
    sent = [r for r in records if start <= r[0] < end]
    lat = [(r[1] - r[0]) * 1000.0 for r in sent if r[2]]
    return {
        "texts_per_s": round(len(done) / dur_s, 2),
        "latency_ms": pct(lat),
        "requests": len(sent),
        "errors": dict(errors),
        "reply_padding_efficiency": round(sum(r[3] for r in sent) / max(1, sum(r[4] for r in sent)), 4),
        "client_cpu_cores": round(client_cpu / wall, 2),
        "_sent": sent,  # (sent, received, ok, tokens, padded): dropped before the JSON is written
        "_done": done,
    }


# ------------------------------------------------------------------ in-process baselines


def _batch(rows: list[np.ndarray], bucket: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.full((len(rows), bucket), pad_id, dtype=np.int64)  # (B, T)
    mask = np.zeros((len(rows), bucket), dtype=np.int64)  # (B, T)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
        mask[i, : len(r)] = 1
    return ids, mask


def _timed(engine, batches: list, burn: int) -> list[float]:
    """Run each batch; the engine time (ms) of those after the first ``burn``."""
    times = []
    for r, (ids, mask) in enumerate(batches):
        t = time.perf_counter()
        engine.run(ids, mask)
        if r >= burn:
            times.append((time.perf_counter() - t) * 1000.0)
    return times


def ceiling_pass(engine, by_bucket: dict[int, list[np.ndarray]], caps: dict[int, int], sizes: list[int], pad_id: int,
                 burn: int, runs: int, times: dict | None = None) -> dict:
    """Ideal batches: per bucket, batches of the bucket shape (rows cycling through the mix's
    texts of that bucket) at the cap and at a few smaller sizes. Adds the engine times (ms)
    to ``times[bucket][size]``; call it again later to spread the runs over the invocation."""
    times = times if times is not None else {}
    for b, texts in sorted(by_bucket.items()):
        for n in sorted({min(x, caps[b]) for x in sizes}) if texts else ():  # a size over the cap means the cap
            k = sum(len(v) for v in times.get(b, {}).values())  # new rows each pass
            batches = [_batch([texts[(k + r * n + j) % len(texts)] for j in range(n)], b, pad_id) for r in range(burn + runs)]
            times.setdefault(b, {}).setdefault(n, []).extend(_timed(engine, batches, burn))
    return times


def ceiling(times: dict, by_bucket: dict[int, list[np.ndarray]], caps: dict[int, int]) -> dict:
    """Per bucket the batch size with the lowest median engine time per text (on a CPU a full
    batch is not always the fastest); texts/s of the mix = 1 / sum(share / texts per second).
    ``cost_ms[b]``: engine ms per text of bucket b at that size."""
    total = sum(len(v) for v in by_bucket.values())
    per, inv = {}, {"min": 0.0, "median": 0.0, "p95": 0.0}
    for b, shapes in sorted(times.items()):
        st = {n: {"min": float(np.min(t)), "median": float(np.median(t)), "p95": float(np.percentile(t, 95)), "runs": len(t)}
              for n, t in shapes.items()}
        best = min(st, key=lambda n: st[n]["median"] / n)
        s, share = st[best], len(by_bucket[b]) / total
        per[str(b)] = {"share": round(share, 4), "cap": caps[b], "best_batch": best, "cost_ms": round(s["median"] / best, 3),
                       "texts_per_s": round(best / s["median"] * 1000.0, 1),
                       "batch_ms": {str(n): {k: round(v, 2) for k, v in x.items()} for n, x in st.items()}}
        for k in inv:
            inv[k] += share * s[k] / 1000.0 / best  # seconds per text of the mix
    return {"by_bucket": per, "texts_per_s": round(1.0 / inv["median"], 2),
            "texts_per_s_range": [round(1.0 / inv["p95"], 2), round(1.0 / inv["min"], 2)]}


def engine_lone(engine, by_bucket: dict[int, list[np.ndarray]], pad_id: int, burn: int, runs: int) -> dict:
    """Batch-1 latency at each bucket shape (ms), on real texts of that bucket."""
    out = {}
    for b, texts in sorted(by_bucket.items()):
        if texts:
            out[str(b)] = pct(_timed(engine, [_batch([texts[r % len(texts)]], b, pad_id) for r in range(burn + runs)], burn), (0, 50, 95))
    return out


def lone_paired(address: str, engine, texts: list[str], ids: list[np.ndarray], buckets: list[int], pad_id: int, pairs: int) -> dict:
    """A lone request against the engine alone, paired: for each text, the served latency at
    concurrency 1 (send to reply) and the in-process engine time of the same text at its
    bucket shape, batch 1, back to back in alternating order, so load from other processes
    drifts into both alike. Overhead = median of the differences (ms)."""
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(address)
    rows = []
    try:
        for k in range(pairs + 3):  # 3 warm-up pairs, dropped
            i = k % len(texts)
            b = min(x for x in buckets if x >= len(ids[i]))
            ids_b, mask_b = _batch([ids[i]], b, pad_id)
            order = (0, 1) if k % 2 else (1, 0)
            got = {}
            for o in order:
                if o == 0:
                    t = time.perf_counter()
                    engine.run(ids_b, mask_b)
                    got[0] = (time.perf_counter() - t) * 1000.0
                else:
                    t = time.perf_counter()
                    s.send_multipart(_body(texts, i, k))
                    if not s.poll(int(REPLY_TIMEOUT_S * 1000)):
                        raise TimeoutError("lone request: no reply")
                    reply = P.decode_reply(s.recv_multipart())
                    got[1] = (time.perf_counter() - t) * 1000.0
            if k >= 3:
                rows.append((b, got[1], got[0], reply.body.get("compute_ms", 0.0), reply.body.get("queue_ms", 0.0)))
    finally:
        s.close(0)
    per = {}
    for b in buckets:
        d = [(x[1], x[2]) for x in rows if x[0] == b]
        if d:
            per[str(b)] = {"served_p50_ms": round(float(np.median([x[0] for x in d])), 2),
                           "engine_p50_ms": round(float(np.median([x[1] for x in d])), 2),
                           "overhead_p50_ms": round(float(np.median([x[0] - x[1] for x in d])), 2), "pairs": len(d)}
    diffs = [x[1] - x[2] for x in rows]
    med = lambda v: round(float(np.median(v)), 3)
    return {"overhead_ms": med(diffs), "overhead_ms_p95": round(float(np.percentile(diffs, 95)), 2), "pairs": len(rows),
            # where the time goes, per the server's reply: its engine time vs ours, its queue wait,
            # and everything outside its engine call (socket, tokenization, hand-offs, encoding)
            "server_compute_minus_engine_ms": med([x[3] - x[2] for x in rows]), "server_queue_ms": med([x[4] for x in rows]),
            "served_minus_server_compute_ms": med([x[1] - x[3] for x in rows]),
            "served_minus_server_compute_ms_min": round(min(x[1] - x[3] for x in rows), 3), "by_bucket": per}


# ------------------------------------------------------------------ the run


def stats_delta(before: dict, after: dict) -> dict:
    """Padding efficiency and mean batch size of what ran between two ``stats`` replies."""
    b0, b1 = before["batches"]["by_bucket"], after["batches"]["by_bucket"]
    d = {k: {f: b1[k][f] - b0.get(k, {}).get(f, 0) for f in ("batches", "texts", "tokens", "padded_tokens")} for k in b1}
    tokens, padded = sum(x["tokens"] for x in d.values()), sum(x["padded_tokens"] for x in d.values())
    batches, texts = sum(x["batches"] for x in d.values()), sum(x["texts"] for x in d.values())
    busy = after.get("latency_ms", {}).get("compute", {}).get("sum", 0.0) - before.get("latency_ms", {}).get("compute", {}).get("sum", 0.0)
    return {"padding_efficiency": round(tokens / padded, 4) if padded else None,
            "mean_batch": round(texts / batches, 2) if batches else None, "_engine_ms": busy}


def measure(server: Server, label: str, fn, *args) -> dict:
    s0, c0, t0 = server.stats(), cpu_s(server.proc.pid), time.perf_counter()
    res = fn(server.address, *args)
    c1, wall = cpu_s(server.proc.pid), time.perf_counter() - t0
    res.update(mode=label, server_cpu_cores=round((c1 - c0) / wall, 2), **stats_delta(s0, server.stats()))
    busy_ms = res.pop("_engine_ms")  # engine time of the batches that ran in the phase
    res["engine_busy"] = round(busy_ms / 1000.0 / wall, 3) if busy_ms else None
    print(f"  {label:<22s} {res['texts_per_s']:8.1f} texts/s  p50 {res['latency_ms']['p50']} ms", file=sys.stderr, flush=True)
    return res


def lone_overhead(c1: dict, engine_ms: dict) -> dict:
    """Concurrency-1 latency minus the engine's batch-1 median at the same bucket (ms)."""
    diffs, per = [], {}
    for b in engine_ms:
        lat = [(r[1] - r[0]) * 1000.0 for r in c1["_sent"] if r[2] and r[4] == int(b)]
        if lat:
            per[b] = {"served_p50_ms": round(float(np.median(lat)), 2), "engine_p50_ms": engine_ms[b]["p50"],
                      "overhead_ms": round(float(np.median(lat)) - engine_ms[b]["p50"], 2), "requests": len(lat)}
            diffs += [x - engine_ms[b]["p50"] for x in lat]
    return {"overhead_ms": round(float(np.median(diffs)), 2) if diffs else None, "by_bucket": per}


def _row(r: dict) -> str:
    lat = r.get("latency_ms", {})
    f = lambda v, spec: format(v, spec) if isinstance(v, (int, float)) else "-"
    return (f"{r['mode']:<22s} {f(r.get('offered_per_s'), '8.1f')} {f(r['texts_per_s'], '8.1f')} {f(r.get('ceiling_texts_per_s'), '7.1f')} "
            f"{f(lat.get('min'), '7.1f')} {f(lat.get('p50'), '7.1f')} {f(lat.get('p95'), '7.1f')} {f(lat.get('p99'), '7.1f')} "
            f"{f(r.get('mean_batch'), '6.1f')} {f(r.get('padding_efficiency'), '6.3f')} {f(r.get('engine_busy'), '5.2f')} "
            f"{f(r.get('client_cpu_cores'), '6.2f')} {f(r.get('server_cpu_cores'), '6.2f')} {sum(r.get('errors', {}).values()):5d}")


def matched_ceiling(run: dict, cost_ms: dict[str, float], dur_s: float) -> None:
    """The ceiling for the texts this phase actually served (its own bucket composition):
    ``vs_ceiling`` = engine-seconds those texts need in ideal batches / the window."""
    ideal_s = sum(cost_ms[str(r[4])] for r in run["_done"]) / 1000.0  # single-text requests: padded = bucket
    run["ceiling_texts_per_s"] = round(len(run["_done"]) / ideal_s, 2) if ideal_s else None
    run["vs_ceiling"] = round(ideal_s / dur_s, 3)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--package", help="model package directory (default: edge's default package, built on first use)")
    p.add_argument("--engine", default="onnxruntime", choices=("onnxruntime", "torchscript"))
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--duration", type=float, help="measured seconds per load phase (default 10; --quick 1.5)")
    p.add_argument("--burn-in", type=float, help="seconds of each load phase before measuring (default 2; --quick 0.5)")
    p.add_argument("--texts", type=int, help="texts in the mix (default 2000; --quick 300)")
    p.add_argument("--seed", type=int, default=0, help="seed of the text mix and of the Poisson arrivals")
    p.add_argument("--json", help="write the JSON record here")
    p.add_argument("--quick", action="store_true", help="short phases, few engine runs: a smoke run (about a minute)")
    args = p.parse_args(argv)
    dur = args.duration or (1.5 if args.quick else 10.0)
    burn = args.burn_in if args.burn_in is not None else (0.5 if args.quick else 2.0)
    n_texts = args.texts or (300 if args.quick else 2000)
    # ceiling: batch sizes tried per bucket (10**9: the bucket's cap), burn-in and measured runs of each;
    # lone: batch-1 runs per bucket, and paired lone requests
    sizes, eng_burn, eng_runs, lone_runs, pairs = (
        ((4,), 1, 1, 3, 10) if args.quick else ((1, 4, 16, 10**9), 1, 2, 15, 60))

    from bench.textmix import describe, text_mix
    from edge.boot import default_package_dir, ensure_default_package
    from edge.engines import load_engine
    from edge.preload.manifest import open_package
    from edge.preload.tokenizer import Tokenizer
    from edge.scheduler import BucketScheduler

    started = time.time()
    say = lambda *a: print(*a, file=sys.stderr, flush=True)  # progress; the report goes to stdout
    pkg_dir = Path(args.package) if args.package else ensure_default_package(default_package_dir())
    pkg = open_package(pkg_dir, verify="size")
    serving, max_len = pkg.manifest.serving_dict(), pkg.manifest.max_seq_length
    buckets = [int(b) for b in serving["buckets"]]
    caps = BucketScheduler(buckets, serving["max_batch_size"], serving["max_batch_tokens"]).caps  # as the server's
    tok = Tokenizer.open(pkg.path(pkg.manifest.tokenizer))
    texts = [t for _, t in text_mix(n_texts, args.seed)]
    mix_info = describe(texts, tok, buckets, max_len)
    ids = [np.asarray(tok.encode(t, max_length=max_len).ids, dtype=np.int64) for t in texts]
    by_bucket: dict[int, list[np.ndarray]] = {b: [] for b in buckets}
    for a in ids:
        by_bucket[min(b for b in buckets if b >= len(a))].append(a)
    say(f"mix: {n_texts} texts, tokens p50 {mix_info['tokens']['p50']} p90 {mix_info['tokens']['p90']}, buckets {mix_info['bucket_share']}")

    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    common = ["--package", str(pkg_dir), "--engine", args.engine, "--device", args.device]
    edge_runs, glue_runs = [], []
    try:
        engine = load_engine(pkg, args.engine, args.device)
        device = engine.device
        # half the ceiling runs now, half after the edge phases: contention from other processes drifts
        ceil_times = ceiling_pass(engine, by_bucket, caps, list(sizes), tok.pad_id, eng_burn, eng_runs)
        say(f"  {'ceiling (in-process)':<22s} {ceiling(ceil_times, by_bucket, caps)['texts_per_s']:8.1f} texts/s (first pass)")
        engine_ms = engine_lone(engine, by_bucket, tok.pad_id, 2, lone_runs)
        edge = Server("edge", [sys.executable, "-m", "edge.boot", *common, "--timeline", str(work / "timeline.json")], work)
        try:
            edge.wait_ready()
            lone = lone_paired(edge.address, engine, texts, ids, buckets, tok.pad_id, pairs)
            say(f"  {'lone request (paired)':<22s} {lone['overhead_ms']:+8.2f} ms over the engine")
            for c in CONCURRENCY:
                edge_runs.append(measure(edge, f"edge closed c={c}", closed_loop, texts, c, burn, dur))
            saturation = max(r["texts_per_s"] for r in edge_runs)
            for i, frac in enumerate(OPEN_FRACTIONS):
                edge_runs.append(measure(edge, f"edge open {int(frac * 100)}%", open_loop, texts, frac * saturation,
                                         burn, dur, args.seed + i, 0))
            edge_stats = edge.stats()
        finally:
            edge.stop()
        ceiling_pass(engine, by_bucket, caps, list(sizes), tok.pad_id, eng_burn, eng_runs, ceil_times)
        ceil = ceiling(ceil_times, by_bucket, caps)
        say(f"  {'ceiling (in-process)':<22s} {ceil['texts_per_s']:8.1f} texts/s (both passes)")
        engine.close()
        del engine
        glue = Server("glue", [sys.executable, "-m", "bench.glue_server", *common], work)
        try:
            glue.wait_ready()
            for c in CONCURRENCY:
                glue_runs.append(measure(glue, f"glue closed c={c}", closed_loop, texts, c, burn, dur))
        finally:
            glue.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    cost = {b: v["cost_ms"] for b, v in ceil["by_bucket"].items()}
    for r in edge_runs:
        matched_ceiling(r, cost, dur)
    sat_run = max((r for r in edge_runs if "closed" in r["mode"]), key=lambda r: r["texts_per_s"])
    glue_sat = max(r["texts_per_s"] for r in glue_runs)
    c1 = lone_overhead(edge_runs[0], engine_ms)
    pad_stats = edge_stats["batches"]["padding_efficiency"]
    pad_replies = round(sum(sum(x[3] for x in r["_sent"]) for r in edge_runs) / max(1, sum(sum(x[4] for x in r["_sent"]) for r in edge_runs)), 4)
    ratios = {
        "vs_ceiling": sat_run["vs_ceiling"],  # against the ceiling of the texts it served
        "vs_ceiling_mix": round(saturation / ceil["texts_per_s"], 3),  # against the whole mix's ceiling
        "vs_glue": round(saturation / glue_sat, 2) if glue_sat else None,
        "lone_overhead_ms": lone["overhead_ms"],
        "padding_efficiency": pad_stats,
    }
    passed = {
        "vs_ceiling": ratios["vs_ceiling"] >= GOALS["vs_ceiling"],
        "vs_glue": ratios["vs_glue"] is not None and ratios["vs_glue"] >= GOALS["vs_glue"],
        "lone_overhead_ms": lone["overhead_ms"] <= GOALS["lone_overhead_ms"],
        "padding_efficiency": pad_stats is not None and pad_stats >= GOALS["padding_efficiency"],
    }

    print(f"\n{'mode':<22s} {'offer/s':>8s} {'texts/s':>8s} {'ceil/s':>7s} {'min':>7s} {'p50':>7s} {'p95':>7s} {'p99':>7s} "
          f"{'batch':>6s} {'padeff':>6s} {'busy':>5s} {'cliCPU':>6s} {'srvCPU':>6s} {'err':>5s}   (latency ms; busy: engine time / wall; CPU in cores)")
    print(_row({"mode": "ceiling (in-process)", "texts_per_s": ceil["texts_per_s"], "padding_efficiency": mix_info["column_efficiency"]}))
    for r in edge_runs + glue_runs:
        print(_row(r))
    print("\nceiling by bucket (best batch: texts/s): " + ", ".join(
        f"{b}: {v['best_batch']}: {v['texts_per_s']:.1f}" for b, v in ceil["by_bucket"].items()))
    print("lone request, paired, by bucket (served vs engine p50 ms): " + ", ".join(
        f"{b}: {v['served_p50_ms']:.1f} vs {v['engine_p50_ms']:.1f} ({v['overhead_p50_ms']:+.1f})" for b, v in lone["by_bucket"].items()))
    ok = lambda k: "ok" if passed[k] else "MISSED"
    summary = (
        f"serve {args.engine}/{device}: saturation {saturation:.1f} texts/s ({sat_run['mode']}) = {ratios['vs_ceiling']:.2f}x ceiling "
        f"(goal >= {GOALS['vs_ceiling']}, {ok('vs_ceiling')}; {ratios['vs_ceiling_mix']:.2f}x the mix ceiling {ceil['texts_per_s']:.1f}), "
        f"{ratios['vs_glue']:.2f}x glue {glue_sat:.1f} (goal >= {GOALS['vs_glue']}, {ok('vs_glue')}); "
        f"lone request {lone['overhead_ms']:+.2f} ms over the engine (goal <= {GOALS['lone_overhead_ms']}, {ok('lone_overhead_ms')}); "
        f"padding efficiency {pad_stats} stats / {pad_replies} replies (goal >= {GOALS['padding_efficiency']}, {ok('padding_efficiency')}); "
        f"{os.cpu_count()} CPUs shared by load generator and server, load avg {os.getloadavg()[0]:.1f}"
    )
    print("\n" + summary)

    if args.json:
        for r in edge_runs + glue_runs:
            r.pop("_sent", None)
            r.pop("_done", None)
        record = {
            "bench": "serve", "command": "python -m bench.serve " + " ".join(argv if argv is not None else sys.argv[1:]),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)), "wall_s": round(time.time() - started, 1),
            "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
                     "loadavg_end": [round(x, 2) for x in os.getloadavg()]},
            "package": str(pkg_dir), "engine": args.engine, "device": device,
            "settings": {"duration_s": dur, "burn_in_s": burn, "concurrency": list(CONCURRENCY), "open_fractions": list(OPEN_FRACTIONS),
                         "buckets": buckets, "batch_caps": {str(b): c for b, c in caps.items()},
                         "ceiling_batch_sizes": [min(x, max(caps.values())) for x in sizes], "ceiling_runs_per_pass": eng_runs,
                         "quick": args.quick},
            "mix": {"n": n_texts, "seed": args.seed, **mix_info},
            "ceiling": ceil, "engine_batch1_ms": engine_ms,
            "edge": {"ready_s": round(edge.ready_s, 3), "runs": edge_runs, "saturation_texts_per_s": saturation,
                     "padding_efficiency_stats": pad_stats, "padding_efficiency_replies": pad_replies,
                     "batch_sizes": edge_stats["batches"]["sizes"],
                     "server_latency_ms": {k: {q: v[q] for q in ("p50", "p95", "p99")} for k, v in edge_stats["latency_ms"].items()}},
            "glue": {"ready_s": round(glue.ready_s, 3), "runs": glue_runs, "saturation_texts_per_s": glue_sat},
            "lone": lone, "c1_vs_engine": c1, "ratios": ratios, "goals": GOALS, "passed": passed, "summary": summary,
        }
        Path(args.json).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
