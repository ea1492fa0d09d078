"""``edge-tokenizer``: compile, prune and try out compiled tokenizers.

    edge-tokenizer compile TOKENIZER_JSON --out FILE.fb
    edge-tokenizer prune TOKENIZER --corpus FILE... --out FILE.fb [--held-out 0.1] [--report-json FILE]
    edge-tokenizer encode --tokenizer FILE.fb [--max-length N]   < JSON lines of strings

``encode`` writes one JSON list of ids per input line, so parity with any other
tokenizer can be checked from the shell.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edge.errors import EdgeError

__all__ = ["main"]


def _compile(args) -> int:
    from image.tokenizer.compile import compile_tokenizer_json

    data = compile_tokenizer_json(args.tokenizer_json)
    Path(args.out).write_bytes(data)
    print(f"wrote {args.out}: {len(data)} bytes")
    return 0


def _prune(args) -> int:
    from image.tokenizer.prune import format_report, prune_tokenizer

    result = prune_tokenizer(args.tokenizer, args.corpus, held_out=args.held_out)
    Path(args.out).write_bytes(result.fb_bytes)
    print(format_report(result.report))
    print(f"wrote {args.out}")
    if args.report_json:
        Path(args.report_json).write_text(json.dumps(result.report, indent=2) + "\n")
    return 0


def _encode(args) -> int:
    from edge.preload.tokenizer import Tokenizer

    tok = Tokenizer.open(args.tokenizer)
    out = sys.stdout
    for n, line in enumerate(sys.stdin, 1):
        if not line.strip():
            continue
        try:
            text = json.loads(line)
        except ValueError as e:
            print(f"line {n}: not JSON: {e}", file=sys.stderr)
            return 2
        if not isinstance(text, str):
            print(f"line {n}: expected a JSON string, got {type(text).__name__}", file=sys.stderr)
            return 2
        out.write(json.dumps(tok.encode(text, max_length=args.max_length).ids) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="edge-tokenizer", description="Compile, prune and run compiled tokenizers.")
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="tokenizer.json -> .fb")
    c.add_argument("tokenizer_json")
    c.add_argument("--out", required=True)
    c.set_defaults(fn=_compile)
    p = sub.add_parser("prune", help="keep the tokens a corpus uses")
    p.add_argument("tokenizer", help="tokenizer.json or a compiled .fb")
    p.add_argument("--corpus", nargs="+", required=True, help="text files, one text per line")
    p.add_argument("--out", required=True)
    p.add_argument("--held-out", type=float, default=0.1, help="share of lines held out for the report")
    p.add_argument("--report-json", help="also write the report as JSON here")
    p.set_defaults(fn=_prune)
    e = sub.add_parser("encode", help="JSON-lines strings on stdin -> JSON lists of ids on stdout")
    e.add_argument("--tokenizer", required=True)
    e.add_argument("--max-length", type=int, default=None, help="default: the tokenizer.json's truncation")
    e.set_defaults(fn=_encode)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except EdgeError as err:
        print(f"edge-tokenizer {args.command}: {err}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as err:
        print(f"edge-tokenizer {args.command}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
