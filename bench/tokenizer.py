"""Tokenizer benchmark: the compiled ``.fb`` against Hugging Face ``tokenizers``.

    python -m bench.tokenizer [--tokenizer-json PATH] [--repeats 7] [--out bench-tokenizer.json]

One run, both tokenizers, the same tokenizer.json (MiniLM's by default):

* load: ``Tokenizer.open(fb)`` vs ``tokenizers.Tokenizer.from_file(json)``, each timed inside a
  fresh process after its imports (files in the page cache), median of ``--repeats`` processes;
  also ours "open + first encode" (the first encode compiles the added-token regex);
* single: short sentences (8..16 tokens, real gettext messages) encoded one at a time;
* batch: the same sentences in batches of 32 (ours pads to the longest; the reference without
  padding: MiniLM's tokenizer.json pads every input to 128 tokens, so the reference is set to
  ``no_padding()``). Ours is measured with a cold word cache (first pass over texts it has
  never seen) and warm (steady state, what a server sees on repeated vocabulary).

Prints one summary line and writes a JSON record. ``--profile`` prints a cProfile of ours.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_LOAD_OURS = """
import time, sys
from edge.preload.tokenizer import Tokenizer
t0 = time.perf_counter(); tok = Tokenizer.open(sys.argv[1]); t1 = time.perf_counter()
tok.encode("warm up the first encode"); t2 = time.perf_counter()
print(t1 - t0, t2 - t0)
"""
_LOAD_REF = """
import time, sys
from tokenizers import Tokenizer
t0 = time.perf_counter(); tok = Tokenizer.from_file(sys.argv[1]); t1 = time.perf_counter()
tok.encode("warm up the first encode"); t2 = time.perf_counter()
print(t1 - t0, t2 - t0)
"""


def _fresh(script: str, path: str, repeats: int) -> tuple[list[float], list[float]]:
    opens, firsts = [], []
    for _ in range(repeats + 1):  # the first run only warms the page cache
        out = subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True, check=True)
        a, b = map(float, out.stdout.split())
        opens.append(a)
        firsts.append(b)
    return opens[1:], firsts[1:]


def _stats(xs: list[float]) -> dict:
    s = sorted(xs)
    return {"min": s[0], "median": statistics.median(s), "p95": s[min(len(s) - 1, int(0.95 * len(s)))]}


def _rate(fn, n_items: int, repeats: int) -> dict:
    """Items per second over ``repeats`` timed runs of ``fn`` (after one burn-in)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    st = _stats(times)
    return {"per_s_median": n_items / st["median"], "per_s_best": n_items / st["min"], "seconds": st}


def main(argv: list[str] | None = None) -> int:
    from image.tokenizer.samples import MINILM_TOKENIZER_JSON, gettext_texts

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer-json", default=MINILM_TOKENIZER_JSON)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--texts", type=int, default=2048, help="short sentences per throughput run")
    ap.add_argument("--out", default="bench-tokenizer.json")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)

    import tokenizers

    from edge.preload.tokenizer import Tokenizer
    from image.tokenizer.compile import compile_tokenizer_json

    tmp = Path(tempfile.mkdtemp())
    fb_path = tmp / "tokenizer.fb"
    fb_path.write_bytes(compile_tokenizer_json(args.tokenizer_json))

    ours_open, ours_first = _fresh(_LOAD_OURS, str(fb_path), args.repeats)
    ref_open, ref_first = _fresh(_LOAD_REF, args.tokenizer_json, args.repeats)

    ref = tokenizers.Tokenizer.from_file(args.tokenizer_json)
    ref.no_padding()
    ref.no_truncation()
    pool = gettext_texts(40_000, seed=2, max_files=800, per_file=60)
    short = [t for t in pool if 8 <= len(ref.encode(t).ids) <= 16]
    # two disjoint sets, so the "cold" run meets words it has not cached
    texts, cold_texts = short[: args.texts], short[args.texts : 2 * args.texts]
    mean_tokens = statistics.mean(len(ref.encode(t).ids) for t in texts)
    batches = [texts[i : i + 32] for i in range(0, len(texts), 32)]

    ours = Tokenizer.open(fb_path)
    t0 = time.perf_counter()
    for t in cold_texts:
        ours.encode(t)
    cold_single = len(cold_texts) / (time.perf_counter() - t0)

    res = {
        "tokenizer_json": args.tokenizer_json,
        "fb_bytes": fb_path.stat().st_size,
        "texts": len(texts),
        "mean_tokens": mean_tokens,
        "load_s": {"ours_open": _stats(ours_open), "ours_open_first_encode": _stats(ours_first),
                   "tokenizers_from_file": _stats(ref_open), "tokenizers_from_file_first_encode": _stats(ref_first)},
        "single": {
            "ours_warm": _rate(lambda: [ours.encode(t) for t in texts], len(texts), args.repeats),
            "ours_cold_per_s": cold_single,
            "tokenizers": _rate(lambda: [ref.encode(t) for t in texts], len(texts), args.repeats),
        },
        "batch32": {
            "ours_warm": _rate(lambda: [ours.encode_batch(b, max(len(ours.encode(t).ids) for t in b)) for b in batches],
                               len(texts), args.repeats),
            "ours_warm_fixed_bucket_32": _rate(lambda: [ours.encode_batch(b, 32) for b in batches], len(texts),
                                               args.repeats),
            "tokenizers": _rate(lambda: [ref.encode_batch(b) for b in batches], len(texts), args.repeats),
        },
    }  # fmt: skip
    load_ratio = res["load_s"]["tokenizers_from_file"]["median"] / res["load_s"]["ours_open"]["median"]
    single_ratio = res["single"]["ours_warm"]["per_s_median"] / res["single"]["tokenizers"]["per_s_median"]
    batch_ratio = res["batch32"]["ours_warm_fixed_bucket_32"]["per_s_median"] / res["batch32"]["tokenizers"]["per_s_median"]
    cold_ratio = cold_single / res["single"]["tokenizers"]["per_s_median"]
    res["ratios"] = {"load_speedup": load_ratio, "single_throughput": single_ratio,
                     "batch32_throughput": batch_ratio, "single_throughput_cold_cache": cold_ratio}  # fmt: skip
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    print(
        f"tokenizer: load {res['load_s']['ours_open']['median'] * 1e3:.2f} ms vs "
        f"{res['load_s']['tokenizers_from_file']['median'] * 1e3:.1f} ms ({load_ratio:.0f}x faster); "
        f"single {res['single']['ours_warm']['per_s_median']:.0f}/s vs {res['single']['tokenizers']['per_s_median']:.0f}/s "
        f"({single_ratio:.2f}x; cold cache {cold_single:.0f}/s, {cold_ratio:.2f}x); "
        f"batch32 {res['batch32']['ours_warm_fixed_bucket_32']['per_s_median']:.0f}/s vs "
        f"{res['batch32']['tokenizers']['per_s_median']:.0f}/s ({batch_ratio:.2f}x); "
        f"{len(texts)} texts, {mean_tokens:.1f} tokens mean -> {args.out}"
    )
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.runcall(lambda: [ours.encode(t) for t in cold_texts + texts])
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    return 0


if __name__ == "__main__":
    sys.exit(main())
