"""The serve benchmark's in-process baselines: the engine's ceiling on ideal batches of the
mix, its batch-1 latency per bucket, and the lone request paired with the engine alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import zmq

from bench.serve_load import REPLY_TIMEOUT_S, infer_frames, pct
from edge.ipc import protocol as P

__all__ = ["ceiling", "ceiling_pass", "engine_lone", "lone_paired"]


Width = Callable[[int, int], int]  # (bucket, longest text) -> columns: the server's BatchShapes.width


def _batch(rows: list[np.ndarray], bucket: int, pad_id: int, width: Width) -> tuple[np.ndarray, np.ndarray]:
    """The batch as the server pads it: ``width(bucket, longest)`` columns (the bucket on CUDA, the
    longest text on a CPU), so that the baselines run the shapes the server runs."""
    w = width(bucket, max(len(r) for r in rows))
    ids = np.full((len(rows), w), pad_id, dtype=np.int64)  # (B, T)
    mask = np.zeros((len(rows), w), dtype=np.int64)  # (B, T)
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
                 width: Width, burn: int, runs: int, times: dict | None = None) -> dict:
    """Ideal batches: per bucket, batches of the bucket shape (rows cycling through the mix's
    texts of that bucket) at the cap and at a few smaller sizes. Adds the engine times (ms)
    to ``times[bucket][size]``; call it again later to spread the runs over the invocation."""
    times = times if times is not None else {}
    for b, texts in sorted(by_bucket.items()):
        for n in sorted({min(x, caps[b]) for x in sizes}) if texts else ():  # a size over the cap means the cap
            k = sum(len(v) for v in times.get(b, {}).values())  # new rows each pass
            batches = [_batch([texts[(k + r * n + j) % len(texts)] for j in range(n)], b, pad_id, width) for r in range(burn + runs)]
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


def engine_lone(engine, by_bucket: dict[int, list[np.ndarray]], pad_id: int, width: Width, burn: int, runs: int) -> dict:
    """Batch-1 latency of each bucket's texts at the shape the server runs them (ms)."""
    out = {}
    for b, texts in sorted(by_bucket.items()):
        if texts:
            out[str(b)] = pct(_timed(engine, [_batch([texts[r % len(texts)]], b, pad_id, width) for r in range(burn + runs)], burn), (0, 50, 95))
    return out


def lone_paired(address: str, engine, texts: list[str], ids: list[np.ndarray], buckets: list[int], pad_id: int,
                width: Width, pairs: int) -> dict:
    """A lone request against the engine alone, paired: for each text, the served latency at
    concurrency 1 (send to reply) and the in-process engine time of the same text at the shape
    the server runs it (``width``), batch 1, back to back in alternating order, so load from other processes
    drifts into both alike. Overhead = median of the differences (ms)."""
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(address)
    rows = []
    try:
        for k in range(pairs + 3):  # 3 warm-up pairs, dropped
            i = k % len(texts)
            b = min(x for x in buckets if x >= len(ids[i]))
            ids_b, mask_b = _batch([ids[i]], b, pad_id, width)
            order = (0, 1) if k % 2 else (1, 0)
            got = {}
            for o in order:
                if o == 0:
                    t = time.perf_counter()
                    engine.run(ids_b, mask_b)
                    got[0] = (time.perf_counter() - t) * 1000.0
                else:
                    t = time.perf_counter()
                    s.send_multipart(infer_frames(texts, i, k))
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
    def med(v):
        return round(float(np.median(v)), 3)
    return {"overhead_ms": med(diffs), "overhead_ms_p95": round(float(np.percentile(diffs, 95)), 2), "pairs": len(rows),
            # where the time goes, per the server's reply: its engine time vs ours, its queue wait,
            # and everything outside its engine call (socket, tokenization, hand-offs, encoding)
            "server_compute_minus_engine_ms": med([x[3] - x[2] for x in rows]), "server_queue_ms": med([x[4] for x in rows]),
            "served_minus_server_compute_ms": med([x[1] - x[3] for x in rows]),
            "served_minus_server_compute_ms_min": round(min(x[1] - x[3] for x in rows), 3), "by_bucket": per}
