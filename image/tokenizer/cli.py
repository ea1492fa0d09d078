"""``edge-tokenizer``: compile, prune and try out compiled tokenizers.

    edge-tokenizer compile TOKENIZER_JSON --out FILE.fb
    edge-tokenizer prune TOKENIZER --corpus FILE... --out FILE.fb [--held-out 0.1] [--report-json FILE]
    edge-tokenizer encode --tokenizer FILE.fb [--max-length N]   < JSON lines of strings

``encode`` writes one JSON list of ids per input line, so parity with any other
tokenizer can be checked from the shell.

No user mistake prints a traceback: each error is one line naming what is wrong and
what to change, and the exit status says which kind it was (:data:`EXIT_CODES`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from edge.config.command_line import UsageError, exit_epilog
from edge.config.argtypes import number, positive_int
from edge.errors import EdgeError, ErrorCode
from image.bundle.progress import stop_signals

__all__ = ["main", "EXIT_CODES"]

EXIT_CODES = {
    0: "success",
    1: "compile/prune: the tokenizer.json uses a component the compiler does not support (the message names it)",
    2: "usage error, or unusable input: a file that is missing or not a tokenizer, an output that cannot be "
       "written, an encode input line that is not a JSON string",
    130: "interrupted (Ctrl-C); no output file was left half-written",
    143: "terminated (SIGTERM); no output file was left half-written",
}
_EPILOG = exit_epilog(EXIT_CODES)
ENCODE_INPUT = 'input is JSON lines, one JSON string per line (e.g. "hello"); blank lines are skipped'
_MAKE_FB = "make one with `edge-tokenizer compile tokenizer.json --out FILE.fb`, or use a package's tokenizer.fb"


def _input_file(path: str, flag: str) -> Path:
    """``path`` when it is a readable file; UsageError naming ``flag`` otherwise."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{flag} {path}: no such file")
    if p.is_dir():
        raise UsageError(f"{flag} {path} is a directory; give a file")
    try:
        open(p, "rb").close()
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None
    return p


def _output_file(path: str, flag: str) -> Path:
    """``path`` when a file can be written there (checked before the work); UsageError otherwise."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {path} is a directory; give a file name, e.g. {p / 'tokenizer.fb'}")
    parent = p.parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: {parent} is not a directory; create it first or give another path")
    try:
        os.unlink(tempfile.mkstemp(prefix=f".{p.name}.", dir=parent)[1])
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot write in {parent} ({exc.strerror or exc}); "
                         f"give a path on a writable filesystem") from None
    return p


def _write(path: Path, data: bytes) -> None:
    """Written beside ``path`` and renamed into place: an interrupt leaves no half file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as open() would have made it; mkstemp makes it private
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _compile(args) -> int:
    src = _input_file(args.tokenizer_json, "TOKENIZER_JSON")
    out = _output_file(args.out, "--out")
    from image.tokenizer.compile import compile_tokenizer_json

    data = compile_tokenizer_json(src)
    _write(out, bytes(data))
    print(f"wrote {out}: {len(data)} bytes")
    return 0


def _prune(args) -> int:
    src = _input_file(args.tokenizer, "TOKENIZER")
    corpus = [_input_file(c, "--corpus") for c in args.corpus]
    out = _output_file(args.out, "--out")
    report_json = _output_file(args.report_json, "--report-json") if args.report_json else None
    from image.tokenizer.prune import format_report, prune_tokenizer

    result = prune_tokenizer(src, corpus, held_out=args.held_out)
    _write(out, bytes(result.fb_bytes))
    print(format_report(result.report))
    print(f"wrote {out}")
    if report_json:
        _write(report_json, (json.dumps(result.report, indent=2) + "\n").encode())
    return 0


def _encode(args) -> int:
    path = _input_file(args.tokenizer, "--tokenizer")
    from edge.preload.tokenizer import Tokenizer

    try:
        tok = Tokenizer.open(path)
    except EdgeError as exc:
        raise UsageError(f"{exc.message}; --tokenizer must be a compiled tokenizer: {_MAKE_FB}") from None
    need = tok.num_special_tokens
    if args.max_length is not None and args.max_length < need:
        raise UsageError(f"--max-length {args.max_length} leaves no room for the {need} special tokens; "
                         f"give at least {need}")
    if sys.stdin.isatty():
        sys.stderr.write(f"edge-tokenizer encode: reading stdin; {ENCODE_INPUT}; Ctrl-D ends\n")
    out = sys.stdout
    n = 0
    try:
        for n, line in enumerate(sys.stdin, 1):
            if not line.strip():
                continue
            try:
                text = json.loads(line)
            except ValueError:
                raise UsageError(f"line {n} is not JSON; {ENCODE_INPUT}") from None
            if not isinstance(text, str):
                raise UsageError(f"line {n}: expected a JSON string, got {type(text).__name__}; {ENCODE_INPUT}")
            out.write(json.dumps(tok.encode(text, max_length=args.max_length).ids) + "\n")
    except UnicodeDecodeError:
        raise UsageError(f"line {n + 1} is not UTF-8 text; {ENCODE_INPUT}") from None
    finally:
        tok.close()
    return 0


_held_out = number(float, "a number", ok=lambda v: 0.0 <= v < 1.0, rule="a share from 0 (none) up to, not including, 1")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="edge-tokenizer", description="Compile, prune and run compiled tokenizers.",
                                 epilog=_EPILOG)
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="tokenizer.json -> .fb", epilog=_EPILOG)
    c.add_argument("tokenizer_json", metavar="TOKENIZER_JSON", help="a Hugging Face tokenizer.json")
    c.add_argument("--out", required=True, metavar="FILE.fb", help="the compiled tokenizer to write")
    c.set_defaults(fn=_compile, expects="TOKENIZER_JSON must be a Hugging Face tokenizer.json")
    p = sub.add_parser("prune", help="keep the tokens a corpus uses", epilog=_EPILOG)
    p.add_argument("tokenizer", metavar="TOKENIZER", help="tokenizer.json or a compiled .fb")
    p.add_argument("--corpus", nargs="+", required=True, metavar="FILE", help="text files, one text per line")
    p.add_argument("--out", required=True, metavar="FILE.fb", help="the pruned compiled tokenizer to write")
    p.add_argument("--held-out", type=_held_out, default=0.1, metavar="SHARE",
                   help="share of lines held out for the report, 0 <= SHARE < 1 (default 0.1)")
    p.add_argument("--report-json", metavar="FILE", help="also write the report as JSON here")
    p.set_defaults(fn=_prune, expects="TOKENIZER must be a Hugging Face tokenizer.json or a compiled .fb")
    e = sub.add_parser("encode", help="JSON-lines strings on stdin -> JSON lists of ids on stdout",
                       description=f"Encode texts read from stdin; {ENCODE_INPUT}. Writes one JSON list of ids "
                                   f"per text to stdout.", epilog=_EPILOG)
    e.add_argument("--tokenizer", required=True, metavar="FILE.fb", help=f"a compiled tokenizer ({_MAKE_FB})")
    e.add_argument("--max-length", type=positive_int("tokens"), default=None, metavar="N",
                   help="truncate to N tokens, special tokens included (default: the tokenizer.json's truncation)")
    e.set_defaults(fn=_encode, expects=f"--tokenizer must be a compiled tokenizer: {_MAKE_FB}")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    prog = f"edge-tokenizer {args.command}"
    with stop_signals() as stopped:
        try:
            return args.fn(args)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (Terminated)
            print(f"{prog}: {stopped.word}", file=sys.stderr)
            return stopped.exit_code or 130
        except BrokenPipeError:  # the reader of stdout stopped (e.g. `| head`): not an error of ours
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        except UsageError as err:
            print(f"{prog}: {err}", file=sys.stderr)
            return 2
        except EdgeError as err:
            if err.code == ErrorCode.TOKENIZER_UNSUPPORTED:
                print(f"{prog}: {err}; the compiler cannot express it, so the tokenizer cannot be compiled",
                      file=sys.stderr)
                return 1
            print(f"{prog}: {err}; {args.expects}", file=sys.stderr)
            return 2
        except (OSError, ValueError) as err:
            print(f"{prog}: {err}", file=sys.stderr)
            return 2


if __name__ == "__main__":
    sys.exit(main())
