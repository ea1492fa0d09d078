"""The journal's bytes: one JSON object per line, in segment files (docs/trace.md, "Format").

A segment ``journal-<seq>.jsonl`` holds, in this order::

    {"journal":1,"segment":7,"created":1767254400123,"pid":412}          header, once
    {"L":"3f9a0c1d2e4b","lineage":{"model":...,"edge_commit":...}}       lineage record, once per
                                                                          lineage used in the segment
    {"t":"9f1c2ab04d3e5f60","ts":1767254400456,"k":"infer",...,"l":"3f9a0c1d2e4b"}   entries

Why JSON lines: a line is found with ``mmap.find(b'\\n{"t":"<id>"')`` (every entry starts with its
trace id, and nothing else in a file can contain a newline followed by that text: JSON escapes
newlines inside strings), read with ``json.loads``, and a line torn by a power cut is simply a
last line without its newline, which the reader skips. Length-prefixed msgpack would need a
walk from the segment's start to tell an entry's start from a byte inside a payload.

The lineage (model, tokenizer, package and bundle digests, engine, edge's version and commit)
is ~500 bytes and the same for every entry of a process: it is written once per segment as a
record that entries name by a 12-hex-digit id (``l``), so an entry stays ~210 bytes.
"""

from __future__ import annotations

import json
import time

from edge.errors import ErrorCode
from edge.serving.request import phases_ms

__all__ = ["FORMAT", "PREFIX", "SUFFIX", "ENTRY_START", "LINEAGE_START", "PHASES", "segment_name", "segment_seq",
           "lineage_id", "header_line", "lineage_line", "entry_line", "phases_ms", "expand", "is_trace_id"]

FORMAT = 1
PREFIX, SUFFIX = "journal-", ".jsonl"
ENTRY_START = b'\n{"t":"'  # every entry line begins with its trace id, after the previous line's newline
LINEAGE_START = b'\n{"L":"'
PHASES = ("load", "transfer", "forward", "post", "total")  # the "ms" list, in this order
MAX_MESSAGE = 200  # characters of an error message kept (the code and name say the rest)
MAX_IDENTITY = 64  # bytes of a client's routing identity kept (shown as hex)
_HEX = frozenset("0123456789abcdef")
# ASCII only: a lone surrogate in a JSON request id would not encode as UTF-8.
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, default=str).encode


def segment_name(seq: int) -> str:
    return f"{PREFIX}{seq:010d}{SUFFIX}"


def segment_seq(name: str) -> int | None:
    """The sequence number of a segment file's name, None for any other name."""
    if not (name.startswith(PREFIX) and name.endswith(SUFFIX)):
        return None
    digits = name[len(PREFIX):-len(SUFFIX)]
    return int(digits) if digits.isascii() and digits.isdigit() else None  # not int("²")


def is_trace_id(text: str) -> bool:
    return len(text) == 16 and set(text) <= _HEX


def lineage_id(lineage: dict) -> str:
    import hashlib  # 7 ms of import that `edge trace` does not need (the boot has it already)

    return hashlib.sha256(json.dumps(lineage, sort_keys=True, default=str).encode()).hexdigest()[:12]


def header_line(seq: int, pid: int, created_ms: int | None = None) -> bytes:
    created = int(time.time() * 1000) if created_ms is None else created_ms
    return (_dumps({"journal": FORMAT, "segment": seq, "created": created, "pid": pid}) + "\n").encode()


def lineage_line(lid: str, lineage: dict) -> bytes:
    return (_dumps({"L": lid, "lineage": lineage}) + "\n").encode()


def _ms(v: float | None):
    return None if v is None else round(v, 3)


def entry_line(item: tuple, wall_offset: float, lid: str) -> bytes:
    """One entry from a :meth:`edge.observability.journal.writer.Journal.note` tuple; ``wall_offset``: wall clock
    minus monotonic clock (s), to date the monotonic stamps."""
    (kind, trace_id, received, replied, identity, conn, address, request_id, code, message, drop, req, _) = item
    d = {"t": trace_id, "ts": int((received + wall_offset) * 1000), "k": kind, "c": identity[:MAX_IDENTITY].hex()}
    if conn:
        d["conn"] = conn
    if address:
        d["peer"] = address
    if request_id is not None:
        d["rid"] = request_id
    enqueued = done = None
    compute_ms = 0.0
    if req is not None:
        n, tokens, buckets, truncated, enqueued, done, compute_ms, batches, degraded = req
        d["n"] = n
        if tokens:
            d["tok"], d["b"] = tokens, buckets
            if any(truncated):
                d["tr"] = [i for i, t in enumerate(truncated) if t]
        if batches:
            d["bat"] = batches
        if degraded:
            d["deg"] = True
    d["ms"] = [_ms(v) for v in phases_ms(received, enqueued, done, compute_ms, replied)]
    d["code"] = code
    if code:
        d["err"] = ErrorCode(code).name if code in ErrorCode._value2member_map_ else str(code)
        if message:
            d["msg"] = message[:MAX_MESSAGE]
    if drop:
        d["drop"] = drop
    d["l"] = lid
    return (_dumps(d) + "\n").encode()


def _iso(ms: int | None) -> str | None:
    if not isinstance(ms, int):
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def expand(e: dict) -> dict:
    """An entry as ``edge trace`` shows it: the short keys spelled out, absent fields filled."""
    ms = list(e.get("ms") or []) + [None] * len(PHASES)
    tokens = e.get("tok") or []
    flagged = set(e.get("tr") or ())
    return {
        "trace_id": e.get("t"),
        "time": _iso(e.get("ts")),
        "time_ms": e.get("ts"),
        "type": e.get("k"),
        "client": {"identity": e.get("c"), "connection": e.get("conn"), "peer": e.get("peer")},
        "request_id": e.get("rid"),
        "texts": e.get("n"),
        "token_counts": tokens,
        "buckets": e.get("b") or [],
        "truncated": [i in flagged for i in range(len(tokens))],
        "batches": [{"batch": b[0], "texts": b[1]} for b in e.get("bat") or () if isinstance(b, list) and len(b) == 2],
        "timings_ms": dict(zip(PHASES, ms)),
        "code": e.get("code"),
        "name": e.get("err") or ("OK" if e.get("code") == 0 else None),
        "message": e.get("msg"),
        "degraded": bool(e.get("deg", False)),
        "dropped": e.get("drop"),
        "lineage_id": e.get("l"),
    }
