"""The serve benchmark's load generators: closed loop (C threads, one request each in flight)
and open loop (Poisson arrivals, latency from the scheduled send time), and the window
that turns their records into throughput and latency.
"""

from __future__ import annotations

import itertools
import os
import random
import threading
import time
from collections import Counter

import numpy as np
import zmq

from edge.ipc import protocol as P

__all__ = ["REPLY_TIMEOUT_S", "closed_loop", "cpu_s", "infer_frames", "open_loop", "pct"]

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



def infer_frames(texts: list[str], i: int, rid: int) -> list[bytes]:
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
                s.send_multipart(infer_frames(texts, next(counter), rid))
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
                s.send_multipart(infer_frames(texts, offset + nxt, nxt))
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
