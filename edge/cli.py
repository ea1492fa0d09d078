"""``edge`` command line: ``serve`` (the runtime), ``gateway`` (its HTTP front, ``edge/gateway/``), ``embed``/``health``/``stats`` (a client),
``selftest`` (the updater's health gate, ``edge/commands/selftest.py``), ``top`` (a live view,
``edge/commands/top.py``), ``doctor`` (the technician's check, ``edge/commands/doctor/``), ``keys generate``
(CURVE keys for tcp://, ``edge/commands/keys.py``) and ``trace`` (a reply's journal entry, ``edge/commands/trace.py``).

No user mistake prints a traceback: every error is one line on stderr naming what is wrong
and what to change, and the exit status says which kind it was (:data:`EXIT_CODES`).
"""

from __future__ import annotations

import argparse
import json
import sys

from edge.config.argtypes import positive_number
from edge.config.command_line import exit_epilog, fail

__all__ = ["main", "EXIT_CODES"]

EXIT_CODES = {
    0: "success (health: the server is ready)",
    1: "the server answered with an error (health: alive but not ready; selftest: a check failed)",
    2: "usage error, or no server to talk to (bad address, no socket, no reply within --timeout)",
    3: "the runtime failed to boot, or the default package could not be built",
    130: "interrupted (Ctrl-C)",
    143: "terminated (SIGTERM) before the runtime started",
}
_EPILOG = exit_epilog(EXIT_CODES)


_positive_seconds = positive_number("seconds")


def _client_parser(sub, name: str, help_: str, timeout_s: float = 5.0,
                   timeout_help: str = "wait at most this long for the reply") -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_, description=help_, epilog=_EPILOG)
    p.add_argument("--connect", metavar="ADDR", default=None,
                   help="server address: ipc://PATH, tcp://HOST:PORT, a socket path or HOST:PORT (default: "
                        "$EDGE_ADDRESS, else ipc://$XDG_RUNTIME_DIR/edge/edge.sock, else ipc:///run/edge/edge.sock)")
    p.add_argument("--timeout", type=_positive_seconds, default=timeout_s, metavar="SECONDS",
                   help=f"{timeout_help} (default {timeout_s:g})")
    p.add_argument("--server-key", metavar="FILE", default=None,
                   help="tcp:// server started with --keys: its public key file, KEYS/server.key (env EDGE_SERVER_KEY)")
    p.add_argument("--client-key", metavar="FILE", default=None,
                   help="with --server-key: this client's secret key file, KEYS/clients/NAME.key_secret, whose public "
                        "key the server authorised (env EDGE_CLIENT_KEY)")
    return p


def _parser() -> argparse.ArgumentParser:
    from edge import __version__

    ap = argparse.ArgumentParser(prog="edge", description="edge inference runtime", epilog=_EPILOG)
    ap.add_argument("--version", action="version", version=f"edge {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("serve", help="boot the runtime and serve (`edge serve --help` lists its options)", add_help=False)
    sub.add_parser("gateway", help="the HTTP gateway: OpenAI and TEI embeddings APIs in front of the runtime "
                                   "(`edge gateway --help` lists its options, docs/gateway.md)", add_help=False)
    e = _client_parser(sub, "embed", "embed texts; prints one JSON line per text")
    e.add_argument("texts", nargs="+", metavar="TEXT")
    e.add_argument("--format", choices=("lines", "reply"), default="lines",
                   help="lines: one JSON object per text ({index, embedding, tokens, truncated, trace_id}); "
                        "reply: the server's whole reply as one JSON document")
    e.add_argument("--request-id", default=None)
    e.add_argument("--deadline-ms", type=float, default=None, help="give up on the request after this many ms")
    e.add_argument("--priority", type=int, default=None, help="0 (first) .. 2 (last); default 1")
    e.add_argument("--no-truncate", action="store_true", help="refuse texts over the model's max length")
    _client_parser(sub, "health", "exit 0 when the server is ready; prints the reply as JSON")
    _client_parser(sub, "stats", "print the server's counters, histograms, timeline and lineage as JSON")
    from edge.commands.selftest import add_arguments as add_selftest_arguments

    add_selftest_arguments(_client_parser(
        sub, "selftest", "health gate for OS updaters: check that the server is ready, serves the package found "
                         "here, embeds the package's reference text as its build did, and booted within the "
                         "package's budget; exit 0 when all hold (docs/selftest.md)",
        timeout_s=30.0, timeout_help="wait at most this long for the server to be ready, and for the whole check"))
    from edge.commands.top import add_arguments as add_top_arguments

    add_top_arguments(_client_parser(
        sub, "top", "a live terminal view of one runtime: requests per second, latency percentiles, queue per "
                    "bucket, batch fill, padding, device telemetry (docs/top.md)"))
    from edge.commands.doctor import add_arguments as add_doctor_arguments

    add_doctor_arguments(_client_parser(
        sub, "doctor", "the technician's check of this device, service up or down: PASS, WARN, FAIL or N/A per "
                       "check with a fix; exit 0 when nothing failed (docs/doctor.md)",
        timeout_help="wait at most this long for each reply of the server"))
    from edge.commands.keys import add_parser as add_keys_parser

    add_keys_parser(sub, _EPILOG)
    from edge.commands.trace import add_arguments as add_trace_arguments

    add_trace_arguments(sub)
    return ap


def _print(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def _fail(command: str, message: str, code: int = 2) -> int:
    return fail(f"edge {command}", message, code)


def _address(args) -> str:
    """The address to connect to, normalized; AddressError names where it came from."""
    from edge.ipc.endpoint import AddressError, default_address, normalize_address
    from edge.config.env import env_address

    given, source = (args.connect, "--connect") if args.connect else (env_address(), "EDGE_ADDRESS")
    if not given:
        return default_address()
    try:
        return normalize_address(given)
    except AddressError as exc:
        raise AddressError(f"{source}: {exc}") from None


def _print_embeddings(fmt: str, result) -> None:
    if fmt == "reply":
        sys.stdout.write(json.dumps({**result.meta, "embeddings": result.embeddings.tolist()}, sort_keys=True) + "\n")
        return
    meta = result.meta
    for i, row in enumerate(result.embeddings):
        sys.stdout.write(json.dumps({"index": i, "embedding": row.tolist(), "tokens": meta["token_counts"][i],
                                     "truncated": meta["truncated"][i], "trace_id": meta["trace_id"]}) + "\n")


def _with_address(args, run) -> int:
    """``run(args, address, curve)`` for the commands that are clients of their own (selftest, top)."""
    from edge.ipc.curve import KeyFileError, client_curve
    from edge.ipc.endpoint import AddressError

    try:
        address = _address(args)
        curve = client_curve(address, args.server_key, args.client_key)
    except (AddressError, KeyFileError) as exc:
        return _fail(args.command, str(exc))
    return run(args, address, curve)


def _doctor(args) -> int:
    """``edge doctor``: the address only when given (else the bundle's own, edge/commands/doctor/)."""
    from edge.commands.doctor import run
    from edge.ipc.curve import KeyFileError, client_curve
    from edge.ipc.endpoint import AddressError, normalize_address

    try:
        address = normalize_address(args.connect) if args.connect else None
        curve = client_curve(address, args.server_key, args.client_key) if address else None
    except (AddressError, KeyFileError) as exc:
        return _fail(args.command, str(exc))
    return run(args, address, curve)


def _client(args) -> int:
    from edge.errors import EdgeError
    from edge.ipc.client import EdgeClient
    from edge.ipc.curve import KeyFileError, client_curve
    from edge.ipc.endpoint import AddressError, check_ipc_server

    try:
        address = _address(args)
        check_ipc_server(address)
        curve = client_curve(address, args.server_key, args.client_key)
    except (AddressError, FileNotFoundError, KeyFileError) as exc:
        # check_ipc_server's FileNotFoundError always has a strerror: str(exc) only for one without
        return _fail(args.command, (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc))
    client = EdgeClient(address, timeout_s=args.timeout, curve=curve)
    try:
        if args.command == "embed":
            result = client.embed(args.texts, request_id=args.request_id, deadline_ms=args.deadline_ms,
                                  priority=args.priority, truncate=False if args.no_truncate else None)
            _print_embeddings(args.format, result)
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
        return _fail(args.command, f"the server refused: {exc}", 1)
    except TimeoutError:
        hint = ""
        if address.startswith("tcp://"):  # a CURVE server never answers a client it refused
            hint = ("; a server started with --keys answers no one whose key it has not authorised (check "
                    "--server-key and that this client's public key is in its authorized_clients)" if curve else
                    "; a server started with --keys answers only clients with keys: --server-key, --client-key")
        return _fail(args.command, f"no reply from {address} within {args.timeout:g} s (is the server running "
                                   f"and ready? `edge health --connect ADDR`; a busy server may need a larger --timeout"
                                   f"{hint})")
    finally:
        client.close()


def serve(argv: list[str]) -> int:
    """``edge serve``: on a build host, build the default package if none is named; then exec the
    runtime exactly as a device starts it (``python -S -m edge.boot``, ``edge/runtime/launch.py``), so its
    timeline starts at that exec and the build is never a boot stage."""
    import os

    from edge.runtime.serve_args import parse_serve_args

    args = parse_serve_args(argv)  # a usage error (a bad address included) stops here, before any build
    if args.package is None:
        from edge.runtime.default_package import PackageBuildError, default_package_dir, ensure_default_package

        try:
            argv = [*argv, "--package", str(ensure_default_package(default_package_dir()))]
        except PackageBuildError as exc:
            return _fail("serve", str(exc), exc.exit_code)
    from edge.runtime.launch import boot_argv, boot_env

    import time

    command = [*boot_argv(), *argv]
    env = boot_env()
    sys.stdout.flush()
    sys.stderr.flush()
    # The kernel's start time of this process is the start of `edge serve`, build included; the
    # runtime's timeline starts at this exec instead.
    env["EDGE_EXEC_BOOTTIME_NS"] = str(time.clock_gettime_ns(time.CLOCK_BOOTTIME))
    os.execve(command[0], command, env)
    return 0  # not reached


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "serve":
            return serve(argv[1:])
        if argv and argv[0] == "gateway":
            from edge.gateway.main import run_gateway

            return run_gateway(argv[1:])
        args = _parser().parse_args(argv)
        if args.command == "keys":
            from edge.commands.keys import run as run_keys

            return run_keys(args)
        if args.command == "selftest":
            from edge.commands.selftest import run as run_selftest

            return _with_address(args, run_selftest)
        if args.command == "top":
            from edge.commands.top import run as run_top

            return _with_address(args, run_top)
        if args.command == "doctor":
            return _doctor(args)
        if args.command == "trace":
            from edge.commands.trace import run as run_trace

            return run_trace(args)
        return _client(args)
    except KeyboardInterrupt:
        sys.stderr.write("edge: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
