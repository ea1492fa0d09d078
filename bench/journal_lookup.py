"""Journal lookup benchmark: `edge trace TRACE_ID` in a journal of a million entries (docs/trace.md).

    python -m bench.journal_lookup [--entries 1000000] [--cap BYTES] [--runs 3] [--dir DIR] [--json FILE]
                                   [--saturation RPS] [--no-cold]

1. **Write**: ``--entries`` realistic entries (the serve benchmark's text mix of buckets, 1 to 64
   texts, batches, phase timings, 2 % errors, 1 % health and stats) go through the real journal:
   ``Journal.note`` as the I/O thread calls it, then the writer's own drain (encode, append,
   rotate, delete) timed on this thread, in chunks of 50,000 so the queue never drops. The cap
   defaults to what holds them all (at least the runtime's 256 MiB). Write throughput is
   entries per second of the writer's work, against the server's saturation rate
   (``--saturation``, requests/s; default: the figure bench.serve measured on a 2-core x86).
2. **Look up**, three ids: the oldest entry (the worst case: every segment is searched, newest
   first), the newest, and one that is not there (every segment, plus the count of entries for
   the message). Each in-process (``edge.observability.journal.reader.find``) and as ``edge trace ID --json``
   in a subprocess (what a technician runs: interpreter start and imports included); ``--runs``
   times each, warm page cache, min and median. Then once with the segments evicted from the
   page cache (``posix_fadvise(DONTNEED)`` after an fsync), the figure of a first lookup after
   a reboot (``--no-cold`` skips it).

Prints a table, one summary line with the worst subprocess time against the 5 s goal, and
writes a JSON record with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from edge.observability.journal import reader
from edge.observability.journal.options import DEFAULT_JOURNAL_MAX_BYTES
from edge.observability.journal.segments import list_segments
from edge.observability.journal.writer import Journal

GOAL_S = 5.0  # issue 17: a request out of 1,000,000 entries within 5 s
CHUNK = 50_000  # entries noted before the writer drains them (the queue holds 65,536)
# Saturation of the serve benchmark (python -m bench.serve --quick) on the 2-core x86 host this
# was written on, MiniLM on onnxruntime/CPU, one text per request: 24 texts/s. A device's own
# figure goes in --saturation.
SATURATION_RPS = 24.0
# The text mix's buckets (bench/textmix.py, seed 0, 2,000 texts; docs/benchmarks.md) and their share.
BUCKETS = ((16, 0.335), (32, 0.210), (64, 0.144), (128, 0.144), (256, 0.167))
ERRORS = ((1005, "texts[0] is empty or whitespace only"), (2000, "queue bound reached: 1024 texts admitted"),
          (2001, "deadline passed before the request ran"), (1003, "unknown message type 'embed'; known: infer, "
                                                                   "cancel, health, stats"))
LINEAGE = {"model": "all-MiniLM-L6-v2", "model_sha256": "4" * 64, "tokenizer_sha256": "7" * 64,
           "package_sha256": "9" * 64, "bundle_sha256": "b" * 64, "engine": "onnxruntime", "device": "cuda:0",
           "edge_version": "0.1.0", "edge_commit": "3a1cb0482395a4bd3c8e0af3799f4c4d355d37e0"}


class _Peer:
    """What ``Journal.note`` reads of the I/O thread's return address."""

    __slots__ = ("trace_id", "received", "identity", "conn", "address", "sample")

    def __init__(self, trace_id, received, identity, conn, address):
        self.trace_id, self.received, self.identity = trace_id, received, identity
        self.conn, self.address = conn, address
        self.sample = None


class _Request:
    """What ``Journal.note`` reads of a finished request."""

    __slots__ = ("n_texts", "tokens", "buckets", "truncated", "enqueued", "done", "compute_ms", "batches", "degraded")

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)
        self.degraded = False


def _note_one(j: Journal, rng: random.Random, n: int, now: float) -> str:
    trace_id = "%016x" % rng.getrandbits(64)
    peer = _Peer(trace_id, 0.0, rng.getrandbits(40).to_bytes(5, "big"), 1 + n % 900,
                 f"localhost:1000:1000:{4000 + n % 900}")
    r = rng.random()
    if r < 0.01:  # health and stats: no texts
        peer.received = now - 0.0003
        j.note("health" if r < 0.008 else "stats", peer)
        return trace_id
    texts = 1 if rng.random() < 0.85 else rng.choice((2, 3, 4, 8, 16, 32, 64))
    buckets = rng.choices([b for b, _ in BUCKETS], [w for _, w in BUCKETS], k=texts)
    tokens = [rng.randint(b // 2 + 1, b) for b in buckets]
    load, transfer, forward, post = (rng.uniform(0.1, 0.8), rng.uniform(0.1, 6.0), rng.uniform(3.0, 40.0),
                                     rng.uniform(0.1, 0.5))
    peer.received = now - (load + transfer + forward + post) / 1000.0
    if r < 0.03:  # errors: refused before or in the queue
        code, message = rng.choice(ERRORS)
        req = _Request(n_texts=texts, tokens=[], buckets=[], truncated=[], enqueued=None, done=None, compute_ms=0.0,
                       batches=[])
        j.note("infer" if code >= 2000 else "invalid", peer, code, message, None, req if code >= 2000 else None)
        return trace_id
    enqueued = peer.received + load / 1000.0
    batch = n // 8
    req = _Request(n_texts=texts, tokens=tokens, buckets=buckets, truncated=[t == 256 for t in tokens],
                   enqueued=enqueued, done=enqueued + (transfer + forward) / 1000.0, compute_ms=forward,
                   batches=[[batch + i, rng.randint(1, 32)] for i in range(1 + (texts > 8))])
    j.note("infer", peer, 0, None, f"req-{n}" if rng.random() < 0.3 else None, req)
    return trace_id


def write(directory: str, entries: int, cap: int, seed: int = 0) -> dict:
    """Write ``entries`` through the journal; the writer's drain is timed on this thread."""
    rng = random.Random(seed)
    j = Journal(directory, cap, LINEAGE, queue_max=CHUNK + 1)
    j._open()  # the writer thread's first step
    note, note_s = j.note, [0.0]

    def timed_note(*a, **kw):  # what the I/O thread pays per reply, apart from making up the entry
        t = time.perf_counter()
        note(*a, **kw)
        note_s[0] += time.perf_counter() - t

    j.note = timed_note
    oldest = newest = None
    writer_s = 0.0
    done = 0
    while done < entries:
        n = min(CHUNK, entries - done)
        now = time.monotonic()
        for i in range(n):
            tid = _note_one(j, rng, done + i, now)
            oldest = oldest or tid
            newest = tid
        t = time.perf_counter()
        j._drain()  # the writer thread's loop body: encode, append, rotate, delete the oldest
        writer_s += time.perf_counter() - t
        done += n
    t = time.perf_counter()
    j.segments.close()
    writer_s += time.perf_counter() - t
    info = j.info()
    if info["entries_written"] != entries or info["entries_dropped"]:
        raise SystemExit(f"journal_lookup: wrote {info['entries_written']} of {entries} entries: {info}")
    return {"entries": entries, "cap_bytes": cap, "bytes": info["bytes"], "segments": info["segments"],
            "bytes_per_entry": round(info["bytes"] / entries, 1), "writer_s": round(writer_s, 3),
            "writer_entries_per_s": round(entries / writer_s), "note_us": round(note_s[0] / entries * 1e6, 2),
            "oldest": oldest, "newest": newest}


def _evict(directory: str) -> None:
    """Drop the segments from the page cache (clean pages only: fsync first)."""
    for _, path, _ in list_segments(directory):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _in_process(directory: str, trace_id: str) -> tuple[float, bool, float]:
    """(seconds, found, seconds of the find alone): a miss also counts the entries, as `edge trace` does."""
    t = time.perf_counter()
    found = reader.find(directory, trace_id)
    find_s = time.perf_counter() - t
    if found is None:
        reader.extent(directory)  # what `edge trace` adds for its message
    return time.perf_counter() - t, found is not None, find_s


def _subprocess(directory: str, trace_id: str) -> tuple[float, int]:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "edge.cli", "trace", trace_id, "--json", "--journal-dir", directory],
                       capture_output=True, text=True, timeout=120)
    return time.perf_counter() - t, r.returncode


def lookups(directory: str, ids: dict, runs: int, cold: bool) -> dict:
    out = {}
    for name, trace_id in ids.items():
        expect = name != "missing"
        _in_process(directory, trace_id)  # burn-in: the page cache holds the journal (if it fits)
        warm = [_in_process(directory, trace_id) for _ in range(runs)]
        if any(found != expect for _, found, _ in warm):
            raise SystemExit(f"journal_lookup: lookup of the {name} id found={not expect}")
        sub = [_subprocess(directory, trace_id) for _ in range(runs)]
        if any(rc != (0 if expect else 1) for _, rc in sub):
            raise SystemExit(f"journal_lookup: edge trace of the {name} id exited {[rc for _, rc in sub]}")
        rec = {"trace_id": trace_id, "find_s": min(f for _, _, f in warm),
               "in_process_s": {"min": min(s for s, _, _ in warm), "median": statistics.median(s for s, _, _ in warm)},
               "edge_trace_s": {"min": min(s for s, _ in sub), "median": statistics.median(s for s, _ in sub)}}
        if cold:
            _evict(directory)
            rec["edge_trace_cold_s"] = _subprocess(directory, trace_id)[0]
        out[name] = rec
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.journal_lookup",
                                 description="Time `edge trace` in a journal of a million entries, and the journal's "
                                             "write throughput (docs/trace.md).")
    ap.add_argument("--entries", type=int, default=1_000_000, help="entries written (default 1000000)")
    ap.add_argument("--cap", type=int, default=None, metavar="BYTES",
                    help="the journal's cap (default: enough for --entries, at least the runtime's 256 MiB)")
    ap.add_argument("--runs", type=int, default=3, help="timed lookups of each id (default 3)")
    ap.add_argument("--dir", default=None, help="write the journal here and keep it (default: a temporary one)")
    ap.add_argument("--saturation", type=float, default=SATURATION_RPS, metavar="RPS",
                    help=f"the server's saturation rate, requests/s, for the comparison (default {SATURATION_RPS:g}: "
                         f"bench.serve on a 2-core x86)")
    ap.add_argument("--no-cold", action="store_true", help="skip the lookups with the segments out of the page cache")
    ap.add_argument("--seed", type=int, default=0, help="seed of the generated entries (default 0)")
    ap.add_argument("--json", metavar="FILE", default=None, help="write the record here")
    args = ap.parse_args(argv)
    if args.entries < 2 or args.runs < 1:
        ap.error("--entries >= 2 and --runs >= 1")
    cap = args.cap or max(DEFAULT_JOURNAL_MAX_BYTES, -(-args.entries * 320 // (1 << 20)) << 20)
    tmp = None if args.dir else tempfile.mkdtemp(prefix="edge-journal-bench-")
    directory = args.dir or os.path.join(tmp, "journal")
    try:
        say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
        say(f"writing {args.entries} entries into {directory} (cap {cap >> 20} MiB)")
        w = write(directory, args.entries, cap, args.seed)
        held = reader.find(directory, w["oldest"]) is not None
        if not held:
            raise SystemExit("journal_lookup: the cap did not hold every entry; give a larger --cap")
        say(f"  {w['bytes'] / 1e6:.1f} MB in {w['segments']} segments, {w['bytes_per_entry']} bytes/entry; writer "
            f"{w['writer_entries_per_s']} entries/s, note() {w['note_us']} µs")
        ids = {"oldest": w["oldest"], "newest": w["newest"], "missing": "%016x" % random.Random(-1).getrandbits(64)}
        look = lookups(directory, ids, args.runs, not args.no_cold)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{'id':<8s} {'in-process min':>15s} {'median':>8s} {'edge trace min':>15s} {'median':>8s} "
          f"{'cold':>8s}")
    for name, r in look.items():
        cold = r.get("edge_trace_cold_s")
        print(f"{name:<8s} {r['in_process_s']['min']:>14.3f}s {r['in_process_s']['median']:>7.3f}s "
              f"{r['edge_trace_s']['min']:>14.3f}s {r['edge_trace_s']['median']:>7.3f}s "
              f"{(f'{cold:.3f}s' if cold is not None else '—'):>8s}")
    worst = max(max(r["edge_trace_s"]["median"], r.get("edge_trace_cold_s") or 0.0) for r in look.values())
    scan = w["bytes"] / look["missing"]["find_s"] / 1e6  # every segment searched, nothing found
    per_day = args.saturation * 86400
    record = {
        "bench": "journal_lookup", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": sys.version.split()[0], "cpus": os.cpu_count(), "write": w, "lookups": look,
        "goal_s": GOAL_S, "worst_edge_trace_s": round(worst, 3), "vs_goal": round(worst / GOAL_S, 3),
        "scan_mb_per_s": round(scan), "saturation_rps": args.saturation,
        "writer_vs_saturation": round(w["writer_entries_per_s"] / args.saturation),
        "day_at_saturation": {"entries": round(per_day), "bytes": round(per_day * w["bytes_per_entry"])},
    }
    print(f"\nwriter {w['writer_entries_per_s']} entries/s = {record['writer_vs_saturation']}x the saturation rate "
          f"({args.saturation:g} requests/s); a day at that rate: {per_day / 1e6:.2f} M entries, "
          f"{per_day * w['bytes_per_entry'] / (1 << 20):.0f} MiB; search {scan:.0f} MB/s")
    print(f"journal_lookup: {args.entries} entries, worst edge trace {worst:.3f} s = {worst / GOAL_S:.2f}x the "
          f"{GOAL_S:g} s goal ({'met' if worst <= GOAL_S else 'MISSED'})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0 if worst <= GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
