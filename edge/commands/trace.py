"""``edge trace TRACE_ID``: what the runtime did with one request, from its journal (docs/trace.md).

Prints the journal's entry for the trace id every reply carries: when, from which client, texts
and tokens, buckets and batches, the time of each phase, the reply's code, and the lineage
(model, tokenizer, package and bundle digests, edge's version and commit); with the request's
payload when it was refused as invalid and kept (``--keep-rejected``). ``--last N`` prints the
newest N entries instead.

It runs as root on files the runtime's user can write, so it trusts none of them
(``edge/observability/journal/checks.py``): regular files only, never through a symlink, lines and nesting
bounded, every field checked. A bad line is skipped and counted, never hiding the good ones:
the count and the reasons go to stderr, and into ``--json``'s ``skipped`` field for one trace
id. Every character of a printed field that is not printable (C0 and C1 controls, DEL, bidi
overrides, line separators, ...) is written as an escape (``\\x1b``, ``\\u202e``), in the text
and, by JSON's own escapes, in ``--json``.

Exit status: 0 found; 1 not found (the message says how far back the journal reaches); 2 usage
error, no journal directory, or one that cannot be read. Standard library only (no zmq, numpy or
engine): it reads files.
"""

from __future__ import annotations

import json
import sys

__all__ = ["add_arguments", "run", "render"]

_PREVIEW_CHARS = 400  # characters of a rejected payload shown as text
_HEX_BYTES = 64  # bytes of it shown in hex
_META_BYTES = 64 << 10  # a sample's metadata is ~1 KiB; a larger file is refused


def add_arguments(sub, epilog: str | None = None) -> None:
    p = sub.add_parser("trace", help="print the journal's entry of a reply's trace id: client, texts, tokens, "
                                     "batches, phase timings, code, lineage (docs/trace.md)",
                       description="Print what the runtime recorded for one reply, by its trace id.",
                       epilog=epilog or "exit status: 0 found; 1 not in the journal; 2 usage error, or no "
                                        "journal, or one that cannot be read")
    p.add_argument("trace_id", nargs="?", metavar="TRACE_ID", help="the reply's trace_id (16 hex digits)")
    p.add_argument("--journal-dir", metavar="DIR", default=None,
                   help="the journal to read (default: $EDGE_JOURNAL_DIR, else STATE_DIR/journal)")
    p.add_argument("--state-dir", metavar="DIR", default=None,
                   help="the runtime's state directory, where the journal and the rejected samples are (default: "
                        "$EDGE_STATE_DIR, else /var/lib/edge/runtime for root, else ~/.local/state/edge)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a block of text")
    p.add_argument("--last", type=int, metavar="N", default=None, help="print the newest N entries instead")


def _clean(text: str) -> str:
    """``text`` with each character that ``str.isprintable`` calls unprintable (C0 and C1
    controls, DEL, bidi overrides and isolates, line and paragraph separators, zero-width and
    other format characters, lone surrogates) written as a Python escape: nothing read from the
    journal moves the cursor, retitles or recolours the terminal, or reorders what is shown."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"
                   if ord(c) < 0x10000 else f"\\U{ord(c):08x}" for c in text)


def _fail(message: str, code: int) -> int:
    sys.stderr.write(f"edge trace: {_clean(message)}\n")
    return code


def _report(skipped) -> None:
    if skipped:
        sys.stderr.write(f"edge trace: {_clean(skipped.summary())}\n")


def _dirs(args) -> tuple[str | None, str]:
    from edge.config.env import env_value
    from edge.observability.journal.options import journal_dir, rejected_dir, state_dir

    state = state_dir(args.state_dir)
    return journal_dir(args.journal_dir or env_value("EDGE_JOURNAL_DIR"), state), rejected_dir(state)


def _decoded(data: bytes):
    """A whole frame as the server would have read it (JSON or msgpack), or None when it is neither
    (or nests deeper than a journal line may)."""
    from edge.observability.journal.checks import loads

    try:
        if data[:1] == b"{":
            return loads(data)
        import msgpack  # only for a sample: a plain lookup does not pay for it

        return loads(json.dumps(msgpack.unpackb(data, raw=False), default=repr).encode())
    except Exception:  # the reason it was refused, often
        return None


def _sample(rejected: str, trace_id: str, as_json: bool, skipped) -> dict | None:
    """The sample kept for ``trace_id`` (``edge/observability/journal/rejected.py``'s files), read as the journal is."""
    import os

    from edge.observability.journal.checks import Bad, read_regular, sample_meta
    from edge.observability.journal.rejected import MAX_FRAMES, SAMPLE_BYTES

    base = os.path.join(rejected, trace_id)
    path = base + ".json"
    try:
        meta = sample_meta(read_regular(path, _META_BYTES), MAX_FRAMES)
        path = base + ".bin"
        data = read_regular(path, SAMPLE_BYTES)
    except (FileNotFoundError, NotADirectoryError, PermissionError):  # none kept, or not for this user (0700)
        return None
    except Bad as exc:
        skipped.file(path, str(exc))
        return None
    except OSError as exc:  # Refused, or not readable
        skipped.file(path, str(exc) if not exc.strerror else exc.strerror)
        return None
    offset = 0
    for frame in meta["frames"]:
        kept, offset = data[offset:offset + frame["kept"]], offset + frame["kept"]
        frame["text"] = kept.decode("utf-8", "replace")[:_PREVIEW_CHARS if not as_json else None]
        frame["hex"] = kept.hex() if as_json else kept[:_HEX_BYTES].hex(" ")
        frame["decoded"] = _decoded(kept) if not frame["truncated"] else None
    meta["path"] = f"{rejected}/{trace_id}.bin"
    return meta


def _record(entry: dict, lineage: dict | None, segment: str | None) -> dict:
    from edge.observability.journal.format import expand

    out = expand(entry)
    out["lineage"] = lineage
    if segment:
        out["segment"] = segment
    return out


def _when(ms) -> str:
    from edge.observability.journal.format import expand

    return expand({"ts": ms})["time"] or "—"


def _num(v) -> str:
    return "—" if v is None else f"{v:.3f}"


def render(rec: dict) -> str:
    """The human block of one expanded entry (lineage and sample included when present)."""
    code = rec.get("code")
    status = "ok" if code == 0 else f"{rec.get('name')} ({code})"
    lines = [f"trace {rec['trace_id']}  {rec.get('type')}  {status}" + ("  (reply not delivered: "
                                                                          f"{rec['dropped']})" if rec.get("dropped")
                                                                          else "")]
    add = lambda k, v: lines.append(f"  {k:<11s} {v}")  # noqa: E731
    add("time", f"{rec.get('time')} (received)")
    c = rec.get("client") or {}
    add("client", f"identity {c.get('identity')}, connection {c.get('connection') or '—'}, peer "
                  f"{c.get('peer') or '—'}")
    if rec.get("request_id") is not None:
        add("request id", json.dumps(rec["request_id"]))
    if rec.get("message"):
        add("message", rec["message"])
    if rec.get("texts") is not None:
        tokens = rec.get("token_counts") or []
        trunc = sum(bool(t) for t in rec.get("truncated") or ())
        add("texts", f"{rec['texts']}" + (f"; tokens {', '.join(map(str, tokens))}; buckets "
                                           f"{', '.join(map(str, rec.get('buckets') or []))}; truncated {trunc}"
                                           if tokens else ""))
    if rec.get("batches"):
        add("batches", ", ".join(f"#{b['batch']} ({b['texts']} texts)" for b in rec["batches"]))
    t = rec.get("timings_ms") or {}
    add("timings ms", "  ".join(f"{k} {_num(v)}" for k, v in t.items()))
    add("degraded", "yes" if rec.get("degraded") else "no")
    lin = rec.get("lineage")
    if lin:
        first = True
        for k in ("model", "model_sha256", "tokenizer_sha256", "package_sha256", "bundle_sha256", "engine",
                  "device", "edge_version", "edge_commit"):
            add("lineage" if first else "", f"{k} {lin.get(k) if lin.get(k) is not None else '—'}")
            first = False
    else:
        add("lineage", f"{rec.get('lineage_id')} (no lineage record found)")
    if rec.get("segment"):
        add("journal", rec["segment"])
    s = rec.get("rejected_sample")
    if s:
        add("rejected", f"{s.get('frames_total')} frame(s), payload kept in {s.get('path')}"
                        + (" (truncated)" if s.get("truncated") else ""))
        for i, f in enumerate(s.get("frames") or []):
            add("", f"frame {i}: {f['size']} bytes, {f['kept']} kept{' (truncated)' if f.get('truncated') else ''}")
            if f.get("decoded") is not None:
                add("", f"  read {json.dumps(f['decoded'])[:_PREVIEW_CHARS]}")
            add("", f"  text {json.dumps(f.get('text'))}")
            add("", f"  hex  {f.get('hex')}")
    return "\n".join(_clean(line) for line in lines)


def _print(obj, as_json: bool) -> None:
    sys.stdout.write((json.dumps(obj, indent=2, sort_keys=True) if as_json else obj) + "\n")


def run(args) -> int:
    import os

    from edge.observability.journal.checks import Skipped
    from edge.observability.journal.format import is_trace_id

    directory, rejected = _dirs(args)
    if args.last is not None:
        if args.last < 1 or args.trace_id:
            return _fail("--last takes a number of entries >= 1, and no TRACE_ID", 2)
    elif not args.trace_id:
        return _fail("give a TRACE_ID (a reply's trace_id), or --last N", 2)
    trace_id = (args.trace_id or "").strip().lower()
    if args.trace_id and not is_trace_id(trace_id):
        return _fail(f"{args.trace_id!r} is not a trace id (16 hex digits, as in a reply's trace_id)", 2)
    skipped = Skipped()
    try:
        journal = directory if directory is not None and os.path.isdir(directory) else None
        return _lookup(args, trace_id, directory, rejected, journal, skipped)
    except BrokenPipeError:  # stdout closed early (| head): what was printed is what was wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 0
    except (OSError, ValueError, RecursionError, MemoryError) as exc:  # the directory unreadable, or worse
        _report(skipped)
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
        return _fail(f"cannot read the journal at {directory}: {why} (--journal-dir DIR, --state-dir DIR)", 2)


def _lookup(args, trace_id: str, directory: str | None, rejected: str, journal: str | None, skipped) -> int:
    """``journal``: ``directory`` where it is a directory (holds the journal), else None."""
    if args.last is not None:
        if journal is None:
            return _fail(f"no journal at {directory} (--journal-dir DIR, --state-dir DIR)", 2)
        from edge.observability.journal.reader import last

        recs = [_record(e, lin, None) for e, lin in last(journal, args.last, skipped)]
        _report(skipped)
        _print(recs if args.json else "\n\n".join(render(r) for r in recs), args.json)
        return 0
    sample = _sample(rejected, trace_id, args.json, skipped)
    found = None
    if journal is not None:
        from edge.observability.journal.reader import find

        found = find(journal, trace_id, skipped)
    if found is not None:
        rec = _record(found.entry, found.lineage, found.segment)
    elif sample is not None:  # a sample whose entry is not (or no longer) in the journal
        rec = {"trace_id": trace_id, "type": sample.get("type"), "code": sample.get("code"),
               "name": sample.get("name"), "message": sample.get("message"), "time": _when(sample.get("time_ms")),
               "client": sample.get("client"), "request_id": sample.get("request_id"), "lineage": None,
               "lineage_id": None, "timings_ms": {}, "journal_entry": False}
    elif journal is None:
        _report(skipped)
        return _fail(f"no journal at {directory}: point --journal-dir (or --state-dir) at the runtime's "
                     f"(edge serve --journal-dir, --state-dir)", 2)
    else:
        from edge.observability.journal.reader import extent

        x = extent(journal, skipped=skipped)
        _report(skipped)
        return _fail(f"{trace_id} is not in the journal at {directory}: it holds {x['entries']} entries in "
                     f"{x['segments']} segment(s) ({x['bytes']} bytes), from {_when(x['oldest_ms'])} to "
                     f"{_when(x['newest_ms'])}", 1)
    rec["rejected_sample"] = sample
    rec["skipped"] = skipped.as_dict()
    _report(skipped)
    _print(rec if args.json else render(rec), args.json)
    return 0
