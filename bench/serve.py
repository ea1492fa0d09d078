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

Goals (issue 29): saturation >= 0.95 x ceiling and >= 4 x glue; lone request (concurrency 1,
paired) <= the engine's batch-1 latency + 1.5 ms; padding efficiency >= 0.9; texts/s at 32 clients
>= at 1. The ceiling and the engine's lone latency run the shapes the server runs (the bucket's
length on CUDA, the batch's longest text on a CPU: BatchShapes.width).
Prints a table and one summary line; ``--json FILE`` writes the record.

This module runs the phases and reports; the pieces: ``bench/serve_server.py`` (the server
subprocesses), ``bench/serve_load.py`` (the load generators), ``bench/serve_ceiling.py``
(the in-process ceiling and the engine's lone-request baselines).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.serve_ceiling import ceiling, ceiling_pass, engine_lone, lone_paired
from bench.serve_load import closed_loop, cpu_s, open_loop
from bench.serve_server import Server

# Issue 29's goals; scaling: texts/s at the most clients over at one.
GOALS = {"vs_ceiling": 0.95, "vs_glue": 4.0, "lone_overhead_ms": 1.5, "padding_efficiency": 0.9, "scaling": 1.0}
CONCURRENCY = (1, 8, 32)
OPEN_FRACTIONS = (0.5, 0.8, 1.0)  # of the best closed-loop throughput


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
    def f(v, spec):
        return format(v, spec) if isinstance(v, (int, float)) else "-"
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
    from edge.runtime.default_package import default_package_dir, ensure_default_package
    from edge.engines import load_engine
    from edge.engines.device import device_kind
    from edge.preload.manifest import open_package
    from edge.preload.tokenizer import Tokenizer
    from edge.serving.shapes import BatchShapes

    started = time.time()
    def say(*a):  # progress; the report goes to stdout
        print(*a, file=sys.stderr, flush=True)
    pkg_dir = Path(args.package) if args.package else ensure_default_package(default_package_dir())
    pkg = open_package(pkg_dir, verify="size")
    shapes = BatchShapes(pkg.manifest.serving, max_seq_length=pkg.manifest.max_seq_length)  # the server's (on a CPU)
    buckets, max_len = shapes.buckets, shapes.max_text_tokens
    caps = {b: shapes.rows(b) for b in buckets}
    tok = Tokenizer.open(pkg.path(pkg.manifest.tokenizer))
    texts = [t for _, t in text_mix(n_texts, args.seed)]
    mix_info = describe(texts, tok, shapes)
    ids = [np.asarray(tok.encode(t, max_length=max_len).ids, dtype=np.int64) for t in texts]
    by_bucket: dict[int, list[np.ndarray]] = {b: [] for b in buckets}
    for a in ids:
        by_bucket[shapes.bucket_for(len(a))].append(a)
    say(f"mix: {n_texts} texts, tokens p50 {mix_info['tokens']['p50']} p90 {mix_info['tokens']['p90']}, buckets {mix_info['bucket_share']}")

    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    common = ["--package", str(pkg_dir), "--engine", args.engine, "--device", args.device]
    edge_runs, glue_runs = [], []
    try:
        engine = load_engine(pkg, args.engine, args.device)
        device = engine.device
        # The columns the server runs a batch at, by its own rule for this device (BatchShapes.width).
        width = BatchShapes(pkg.manifest.serving, max_seq_length=pkg.manifest.max_seq_length,
                            kind=device_kind(device)).width
        # half the ceiling runs now, half after the edge phases: contention from other processes drifts
        ceil_times = ceiling_pass(engine, by_bucket, caps, list(sizes), tok.pad_id, width, eng_burn, eng_runs)
        say(f"  {'ceiling (in-process)':<22s} {ceiling(ceil_times, by_bucket, caps)['texts_per_s']:8.1f} texts/s (first pass)")
        engine_ms = engine_lone(engine, by_bucket, tok.pad_id, width, 2, lone_runs)
        edge = Server("edge", [sys.executable, "-m", "edge.boot", *common, "--timeline", str(work / "timeline.json")], work)
        try:
            edge.wait_ready()
            lone = lone_paired(edge.address, engine, texts, ids, buckets, tok.pad_id, width, pairs)
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
        ceiling_pass(engine, by_bucket, caps, list(sizes), tok.pad_id, width, eng_burn, eng_runs, ceil_times)
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
    closed = {r["mode"]: r["texts_per_s"] for r in edge_runs if "closed" in r["mode"]}
    lo, hi = closed.get(f"edge closed c={CONCURRENCY[0]}"), closed.get(f"edge closed c={CONCURRENCY[-1]}")
    ratios["scaling"] = round(hi / lo, 3) if lo and hi else None  # texts/s at the most clients over at one
    passed["scaling"] = ratios["scaling"] is not None and ratios["scaling"] >= GOALS["scaling"]

    print(f"\n{'mode':<22s} {'offer/s':>8s} {'texts/s':>8s} {'ceil/s':>7s} {'min':>7s} {'p50':>7s} {'p95':>7s} {'p99':>7s} "
          f"{'batch':>6s} {'padeff':>6s} {'busy':>5s} {'cliCPU':>6s} {'srvCPU':>6s} {'err':>5s}   (latency ms; busy: engine time / wall; CPU in cores)")
    print(_row({"mode": "ceiling (in-process)", "texts_per_s": ceil["texts_per_s"], "padding_efficiency": mix_info["column_efficiency"]}))
    for r in edge_runs + glue_runs:
        print(_row(r))
    print("\nceiling by bucket (best batch: texts/s): " + ", ".join(
        f"{b}: {v['best_batch']}: {v['texts_per_s']:.1f}" for b, v in ceil["by_bucket"].items()))
    print("lone request, paired, by bucket (served vs engine p50 ms): " + ", ".join(
        f"{b}: {v['served_p50_ms']:.1f} vs {v['engine_p50_ms']:.1f} ({v['overhead_p50_ms']:+.1f})" for b, v in lone["by_bucket"].items()))
    def ok(k):
        return "ok" if passed[k] else "MISSED"
    summary = (
        f"serve {args.engine}/{device}: saturation {saturation:.1f} texts/s ({sat_run['mode']}) = {ratios['vs_ceiling']:.2f}x ceiling "
        f"(goal >= {GOALS['vs_ceiling']}, {ok('vs_ceiling')}; {ratios['vs_ceiling_mix']:.2f}x the mix ceiling {ceil['texts_per_s']:.1f}), "
        f"{ratios['vs_glue']:.2f}x glue {glue_sat:.1f} (goal >= {GOALS['vs_glue']}, {ok('vs_glue')}); "
        f"lone request {lone['overhead_ms']:+.2f} ms over the engine (goal <= {GOALS['lone_overhead_ms']}, {ok('lone_overhead_ms')}); "
        f"padding efficiency {pad_stats} stats / {pad_replies} replies (goal >= {GOALS['padding_efficiency']}, {ok('padding_efficiency')}); "
        f"texts/s at c={CONCURRENCY[-1]} over c={CONCURRENCY[0]} {ratios['scaling']} (goal >= 1, {ok('scaling')}); "
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
