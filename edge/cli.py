"""``edge`` command line: ``serve`` (the runtime) and ``embed``/``health``/``stats`` (a client).

Exit status of the client commands: 0 success (``health``: the server is ready),
1 the server answered with an error (``health``: alive but not ready),
2 no reply within the timeout or a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["main"]


def _client_parser(sub: argparse._SubParsersAction, name: str, help_: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_)
    p.add_argument("--connect", metavar="ADDR", default=None,
                   help="server address, ipc://PATH or tcp://HOST:PORT (default: $EDGE_ADDRESS, "
                        "else ipc://$XDG_RUNTIME_DIR/edge/edge.sock, else ipc:///run/edge/edge.sock)")
    p.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS", help="wait at most this long for the reply")
    return p


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="edge", description="edge inference runtime")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="boot the runtime and serve (`edge serve --help` lists its options)", add_help=False)
    e = _client_parser(sub, "embed", "embed texts; prints the reply as JSON")
    e.add_argument("texts", nargs="+", metavar="TEXT")
    e.add_argument("--request-id", default=None)
    e.add_argument("--deadline-ms", type=float, default=None)
    e.add_argument("--priority", type=int, default=None, help="0 (first) .. 2 (last); default 1")
    e.add_argument("--no-truncate", action="store_true", help="refuse texts over the model's max length")
    _client_parser(sub, "health", "exit 0 when the server is ready; prints the reply as JSON")
    _client_parser(sub, "stats", "print the server's counters, histograms, timeline and lineage as JSON")
    return ap


def _print(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def serve(argv: list[str]) -> int:
    """``edge serve``: on a build host, build the default package if none is named; then exec the
    runtime exactly as a device starts it (``python -S -m edge.boot``, ``edge/launch.py``), so its
    timeline starts at that exec and the build is never a boot stage."""
    import os

    from edge.settings import parse_serve_args

    args = parse_serve_args(argv)  # a usage error stops here, before any build
    if args.package is None:
        from edge.default_package import default_package_dir, ensure_default_package
        from edge.errors import BootError

        try:
            argv = [*argv, "--package", str(ensure_default_package(default_package_dir()))]
        except BootError as exc:
            sys.stderr.write(f"edge serve: {exc}\n")
            return 3
    from edge.launch import boot_argv, boot_env

    command = [*boot_argv(), *argv]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], command, boot_env())
    return 0  # not reached


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "serve":
        return serve(argv[1:])
    args = _parser().parse_args(argv)

    from edge.errors import EdgeError
    from edge.ipc.client import EdgeClient

    client = EdgeClient(args.connect, timeout_s=args.timeout)
    try:
        if args.command == "embed":
            r = client.embed(
                args.texts, request_id=args.request_id, deadline_ms=args.deadline_ms, priority=args.priority,
                truncate=False if args.no_truncate else None,
            )
            _print({**r.meta, "embeddings": r.embeddings.tolist()})
            return 0
        if args.command == "health":
            body = client.health()
            _print(body)
            return 0 if body.get("ready") else 1
        _print(client.stats())
        return 0
    except EdgeError as exc:
        _print({"error": {"code": int(exc.code), "name": exc.name, "message": exc.message,
                          "trace_id": getattr(exc, "trace_id", None)}})
        return 1
    except TimeoutError as exc:
        sys.stderr.write(f"edge {args.command}: {exc}\n")
        return 2
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
