"""A realistic, seeded mix of text lengths for serving benchmarks, built offline.

    python -m bench.textmix [--package DIR] [--n 2000] [--seed 0]   # prints the token-length distribution

Source: the messages of this machine's gettext catalogs
(``/usr/share/locale/*/LC_MESSAGES/*.mo``, read with Python's ``gettext``): the English
source strings (msgids, with any ``msgctxt`` prefix removed) and, for about one text in
seven, the translations (about 200 languages), the way an appliance sees mostly English
with some other languages. Each text is one of four kinds, drawn with fixed shares; its
length in words is log-normal around the kind's median, and it is built by joining random
messages until that many words, then cut there:

======== ===== ============= ==========================================
kind     share median words  what it stands for
======== ===== ============= ==========================================
query    40 %  5             search queries, commands, labels
sentence 30 %  16            one or two sentences (chat turn, title+line)
passage  22 %  60            a paragraph (retrieval chunk)
document  8 %  220           a page; usually over 256 tokens: truncated
======== ===== ============= ==========================================

The same ``seed`` gives the same texts on any machine with the same catalogs. The
token-length distribution with the MiniLM tokenizer is documented in
``docs/benchmarks.md`` and printed by :func:`describe` (every benchmark run records it).
"""

from __future__ import annotations

import argparse
import functools
import gettext
import glob
import json
import math
import random

__all__ = ["KINDS", "describe", "message_pool", "text_mix"]

CATALOGS = "/usr/share/locale/*/LC_MESSAGES/*.mo"
# (name, share of texts, median words, sigma of log(words)); see the module docstring.
KINDS = (
    ("query", 0.40, 5, 0.45),
    ("sentence", 0.30, 16, 0.40),
    ("passage", 0.22, 60, 0.40),
    ("document", 0.08, 220, 0.30),
)
TRANSLATED_SHARE = 0.15  # texts drawn from translations instead of English msgids
MAX_CATALOGS = 300  # catalogs read (seeded choice); all 3,600 would take ~10 s


def _clean(s: str) -> str:
    if "\x04" in s:  # "msgctxt\x04msgid"
        s = s.split("\x04", 1)[1]
    return " ".join(s.split())


@functools.lru_cache(maxsize=4)
def message_pool(seed: int = 0, pattern: str = CATALOGS, max_catalogs: int = MAX_CATALOGS) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(English msgids, translations), each distinct, sorted, from a seeded choice of catalogs."""
    rng = random.Random(seed)
    paths = sorted(glob.glob(pattern))
    rng.shuffle(paths)
    english, translated = set(), set()
    for path in paths[:max_catalogs]:
        try:
            with open(path, "rb") as f:
                catalog = gettext.GNUTranslations(f)._catalog
        except (OSError, ValueError, LookupError, UnicodeError):  # a malformed catalog (bad magic, header, charset)
            continue
        for k, v in catalog.items():
            if isinstance(k, str) and (k := _clean(k)) and any(c.isalpha() for c in k):
                english.add(k)
            if isinstance(v, str) and (v := _clean(v)) and any(c.isalpha() for c in v) and "\n" not in v:
                translated.add(v)
    english.discard("")
    if not english:
        raise RuntimeError(f"no gettext messages found under {pattern}")
    return tuple(sorted(english)), tuple(sorted(translated))


def text_mix(n: int = 2000, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` texts as ``(kind, text)``, in a seeded random order."""
    english, translated = message_pool(seed)
    rng = random.Random(seed + 1)
    names = [k[0] for k in KINDS]
    weights = [k[1] for k in KINDS]
    params = {k[0]: (k[2], k[3]) for k in KINDS}
    out = []
    for _ in range(n):
        kind = rng.choices(names, weights)[0]
        median, sigma = params[kind]
        words = max(1, round(math.exp(rng.gauss(math.log(median), sigma))))
        pool = translated if translated and rng.random() < TRANSLATED_SHARE else english
        acc: list[str] = []
        while len(acc) < words:
            acc.extend(rng.choice(pool).split())
        out.append((kind, " ".join(acc[:words])))
    return out


def _pct(xs: list[int], q: float) -> int:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def describe(texts: list[str], tokenizer, shapes) -> dict:
    """Token-length distribution of ``texts`` (specials included, after truncation to
    ``shapes.max_text_tokens``) and the share of each length bucket (``shapes``: the server's
    :class:`edge.serving.shapes.BatchShapes`); ``column_efficiency`` = real tokens / bucket
    tokens, the padding efficiency of perfectly filled batches of the bucket shapes."""
    counts, truncated = [], 0
    for t in texts:
        enc = tokenizer.encode(t, max_length=shapes.max_text_tokens)
        counts.append(len(enc.ids))
        truncated += bool(enc.truncated)
    bucket_of = [shapes.bucket_for(n) for n in counts]
    share = {str(b): round(sum(1 for x in bucket_of if x == b) / len(counts), 4) for b in shapes.buckets}
    return {
        "texts": len(counts),
        "tokens": {"min": min(counts), "p10": _pct(counts, 0.10), "p25": _pct(counts, 0.25), "p50": _pct(counts, 0.50),
                   "p75": _pct(counts, 0.75), "p90": _pct(counts, 0.90), "p99": _pct(counts, 0.99), "max": max(counts),
                   "mean": round(sum(counts) / len(counts), 1)},
        "truncated_share": round(truncated / len(counts), 4),
        "bucket_share": share,
        "column_efficiency": round(sum(counts) / sum(bucket_of), 4),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.textmix", description=__doc__.split("\n\n")[0])
    p.add_argument("--package", help="model package (default: edge's default package)")
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--show", type=int, default=0, help="print this many texts of each kind")
    args = p.parse_args(argv)
    from pathlib import Path

    from edge.runtime.default_package import default_package_dir, ensure_default_package
    from edge.preload.manifest import open_package
    from edge.preload.tokenizer import Tokenizer
    from edge.serving.shapes import BatchShapes

    pkg = open_package(Path(args.package) if args.package else ensure_default_package(default_package_dir()), verify="size")
    tok = Tokenizer.open(pkg.path(pkg.manifest.tokenizer))
    shapes = BatchShapes(pkg.manifest.serving, max_seq_length=pkg.manifest.max_seq_length)
    mix = text_mix(args.n, args.seed)
    record = {"n": args.n, "seed": args.seed, "kinds": {k[0]: sum(1 for m in mix if m[0] == k[0]) for k in KINDS},
              **describe([t for _, t in mix], tok, shapes)}
    print(json.dumps(record, indent=1))
    for name, *_ in KINDS:
        for t in [t for k, t in mix if k == name][: args.show]:
            print(f"{name:9s} {t[:160]!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
