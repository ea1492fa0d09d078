"""``edge serve``'s command line: the parser, whose flags default to their ``EDGE_*`` variables
(:mod:`edge.config.env`), and the checks argparse cannot make (an address that parses, keys for a
TCP bind beyond loopback, metrics bounds). A flag given wins over its variable.

Imported at boot: standard library only, plus the address helpers of the transport.
"""

from __future__ import annotations

from edge.config.argtypes import number, parse_listen
from edge.config.env import (DEFAULT_CUDA_RESERVE_MB, DEFAULT_DRAIN_TIMEOUT_S, DEFAULT_ENGINE, DEFAULT_METRICS_INTERVAL_S,
                             DEFAULT_TELEMETRY_INTERVAL_S, env_address, env_value)
from edge.engines.base import ENGINE_NAMES
from edge.observability.journal import options as journal_options
from edge.serving import breaker_options

__all__ = ["serve_parser", "parse_serve_args"]


def _number(kind, env_name: str):
    """A flag's number, with an error naming the flag's variable too."""
    return number(kind, "a whole number" if kind is int else "a number", env_name=env_name)


# The flags whose value is one of a few words: (flag's dest, choices, variable).
_CHOICES = (("engine", ENGINE_NAMES, "EDGE_ENGINE"), ("device", ("auto", "cpu", "cuda"), "EDGE_DEVICE"),
            ("verify", ("full", "size"), "EDGE_VERIFY"), ("ort_prepacking", ("auto", "on", "off"), "EDGE_ORT_PREPACKING"),
            ("warm_up", ("auto", "full", "deferred"), "EDGE_WARM_UP"),
            ("log_level", ("debug", "info", "warning", "error"), "EDGE_LOG_LEVEL"))


def serve_parser(env: dict | None = None):
    """``edge serve``'s parser; each flag's default is its ``EDGE_*`` variable."""
    import argparse

    e = lambda name, default=None: env_value(name, env) or default  # noqa: E731
    choices = {dest: c for dest, c, _ in _CHOICES}
    p = argparse.ArgumentParser(
        prog="edge serve", description="Boot the runtime and serve ZeroMQ requests.",
        epilog="exit status: 0 stopped cleanly after SIGTERM; 1 stopped before every request in flight was "
               "answered (drain timeout); 2 usage error; 3 boot failure (the error names the stage and the "
               "setting to change)")
    p.add_argument("--package", default=e("EDGE_PACKAGE"),
                   help="model package directory (env EDGE_PACKAGE; `edge serve` on a build host builds the "
                        "default package when neither is given)")
    p.add_argument("--engine", choices=choices["engine"], default=e("EDGE_ENGINE", DEFAULT_ENGINE),
                   help="inference engine (env EDGE_ENGINE)")
    p.add_argument("--device", choices=choices["device"], default=e("EDGE_DEVICE", "auto"),
                   help="where the engine runs; auto picks CUDA when present (env EDGE_DEVICE)")
    p.add_argument("--bind", metavar="ADDR", default=env_address(env),
                   help="where to listen: ipc://PATH, tcp://HOST:PORT, a socket path or HOST:PORT (default "
                        "ipc://$XDG_RUNTIME_DIR/edge/edge.sock, else ipc:///run/edge/edge.sock; env EDGE_ADDRESS)")
    p.add_argument("--keys", metavar="DIR", default=e("EDGE_KEYS"),
                   help="CURVE keys for a tcp:// --bind, from `edge keys generate --out DIR`: only the clients whose "
                        "public keys are in DIR/authorized_clients are served; needed to bind beyond loopback "
                        "(env EDGE_KEYS)")
    p.add_argument("--snapshot-point", action="store_true", default=e("EDGE_SNAPSHOT_POINT") == "1",
                   help="stop before the first CUDA call and before bind, write snapshot-point.json beside the "
                        "timeline and wait for SIGUSR2, to be checkpointed there (edge-bundle snapshot; "
                        "docs/snapshot.md) (env EDGE_SNAPSHOT_POINT=1)")
    p.add_argument("--timeline", default=e("EDGE_TIMELINE"),
                   help="file for the boot timeline JSON (default: beside the ipc socket, else /tmp; env EDGE_TIMELINE)")
    p.add_argument("--verify", choices=choices["verify"], default=e("EDGE_VERIFY", "full"),
                   help="package check at boot: sha256 of the files the engine maps (overlapped with the engine "
                        "import) or sizes only (env EDGE_VERIFY)")
    p.add_argument("--ort-prepacking", choices=choices["ort_prepacking"], default=e("EDGE_ORT_PREPACKING", "auto"),
                   help="ONNX Runtime's weight prepacking on a CPU: faster matrix products for a packed copy of "
                        "the weights made at load; auto: on where the boot stops at --snapshot-point (paid once, "
                        "when the snapshot is taken), off on a fresh boot (docs/snapshot.md; env EDGE_ORT_PREPACKING)")
    p.add_argument("--warm-up", choices=choices["warm_up"], default=e("EDGE_WARM_UP", "auto"),
                   help="which shapes warm up before READY on a CPU: full: every one; deferred: the smallest "
                        "(the first run's set-up, and a check of the engine's output), the rest on the idle engine "
                        "once READY (a CPU runs a shape's first time as fast as its later ones); auto: deferred on "
                        "a fresh CPU boot, full where the boot stops at --snapshot-point; CUDA always warms every "
                        "shape first (env EDGE_WARM_UP)")
    p.add_argument("--drain-timeout", type=_number(float, "EDGE_DRAIN_TIMEOUT_S"), metavar="SECONDS",
                   default=e("EDGE_DRAIN_TIMEOUT_S", str(DEFAULT_DRAIN_TIMEOUT_S)),
                   help="seconds to finish in-flight requests after SIGTERM (env EDGE_DRAIN_TIMEOUT_S)")
    p.add_argument("--cuda-reserve-mb", type=_number(int, "EDGE_CUDA_RESERVE_MB"), metavar="MIB",
                   default=e("EDGE_CUDA_RESERVE_MB", str(DEFAULT_CUDA_RESERVE_MB)),
                   help="device memory reserved up front on CUDA, MiB (env EDGE_CUDA_RESERVE_MB)")
    p.add_argument("--log-level", choices=choices["log_level"], default=e("EDGE_LOG_LEVEL", "info"),
                   help="JSON log lines at this level and above; debug adds a line per reply (env EDGE_LOG_LEVEL)")
    p.add_argument("--telemetry-interval", type=_number(float, "EDGE_TELEMETRY_INTERVAL"), metavar="SECONDS",
                   default=e("EDGE_TELEMETRY_INTERVAL", str(DEFAULT_TELEMETRY_INTERVAL_S)),
                   help="seconds between device telemetry samples (GPU load, temperatures, power rails, memory, "
                        "power mode), read on a thread from READY on and returned by stats; 0 turns it off "
                        "(docs/telemetry.md; env EDGE_TELEMETRY_INTERVAL)")
    p.add_argument("--metrics-textfile", metavar="DIR", default=e("EDGE_METRICS_TEXTFILE"),
                   help="write Prometheus metrics to DIR/edge.prom (atomically) for node_exporter's textfile "
                        "collector, from READY on and at shutdown; needs edge[metrics] (docs/metrics.md; "
                        "env EDGE_METRICS_TEXTFILE)")
    p.add_argument("--metrics-interval", type=_number(float, "EDGE_METRICS_INTERVAL_S"), metavar="SECONDS",
                   default=e("EDGE_METRICS_INTERVAL_S", str(DEFAULT_METRICS_INTERVAL_S)),
                   help="seconds between two writes of --metrics-textfile (env EDGE_METRICS_INTERVAL_S)")
    p.add_argument("--metrics-listen", metavar="HOST:PORT", default=e("EDGE_METRICS_LISTEN"),
                   help="serve Prometheus metrics at http://HOST:PORT/metrics from READY on; a bare PORT means "
                        "127.0.0.1:PORT; loopback only unless --metrics-listen-any (env EDGE_METRICS_LISTEN)")
    p.add_argument("--metrics-listen-any", action="store_true", default=e("EDGE_METRICS_LISTEN_ANY") == "1",
                   help="let --metrics-listen bind an address other machines reach: anyone there reads the "
                        "metrics and the build's lineage (env EDGE_METRICS_LISTEN_ANY=1)")
    for flags in (journal_options, breaker_options):  # docs/trace.md, docs/breaker.md
        flags.add_serve_arguments(p, e)
    return p


def parse_serve_args(argv: list[str] | None = None, env: dict | None = None):
    """Parse and check ``edge serve``'s arguments; a usage error exits 2 naming the flag or variable.

    The address is normalized here (``ipc://`` and ``tcp://`` forms, a bare path, ``HOST:PORT``),
    so a bad port or host is refused before the boot starts.
    """
    import sys

    argv = sys.argv[1:] if argv is None else argv
    parser = serve_parser(env)
    args = parser.parse_args(argv)
    if args.bind:
        from edge.ipc.endpoint import AddressError, normalize_address

        try:
            args.bind = normalize_address(args.bind, bind=True)
        except AddressError as exc:
            given = any(a == "--bind" or a.startswith("--bind=") for a in argv)
            parser.error(f"{'argument --bind' if given else 'EDGE_ADDRESS'}: {exc}")
    _check_tcp_auth(parser, args, argv)
    for dest, allowed, name in _CHOICES:  # argparse checks choices of a flag, not of its default
        if getattr(args, dest) not in allowed:
            parser.error(f"{name}={getattr(args, dest)!r}: choose one of {', '.join(allowed)}")
    if args.drain_timeout < 0:
        parser.error("argument --drain-timeout: give seconds >= 0")
    if args.cuda_reserve_mb < 0:
        parser.error("argument --cuda-reserve-mb: give MiB >= 0")
    if args.telemetry_interval != 0 and not 0.1 <= args.telemetry_interval <= 86400:  # shorter: a busy core
        parser.error("argument --telemetry-interval: give 0 (off) or seconds from 0.1 to 86400")
    _check_metrics(parser, args, argv)
    return args


def _check_tcp_auth(parser, args, argv: list[str]) -> None:
    """TCP has no authentication without CURVE keys (edge/ipc/curve.py): refuse a bind that
    other machines can reach without ``--keys``, and ``--keys`` on ipc, where nothing would use them."""
    bind = args.bind or ""  # None: the default ipc socket
    if args.keys and not bind.startswith("tcp://"):
        given = any(a == "--keys" or a.startswith("--keys=") for a in argv)
        parser.error(f"{'argument --keys' if given else 'EDGE_KEYS'}: keys are for a tcp:// --bind; "
                     f"{bind or 'the default ipc socket'} is guarded by its socket file's mode (0660): drop the keys, "
                     f"or bind tcp://HOST:PORT")
    if bind.startswith("tcp://") and not args.keys:
        from edge.ipc.curve import is_loopback

        if not is_loopback(bind):
            parser.error(f"{bind} accepts connections from other machines and TCP has no authentication of its "
                         f"own: run `edge keys generate --out DIR` and pass --keys DIR (env EDGE_KEYS), or bind "
                         f"tcp://127.0.0.1:PORT (this machine only)")


def _check_metrics(parser, args, argv: list[str]) -> None:
    """The metrics flags: a positive interval, a listen address that parses, and one other
    machines reach only with ``--metrics-listen-any`` (the endpoint has no authentication)."""
    if not 0 < args.metrics_interval <= 86400:  # NaN and inf too: a thread's wait takes neither
        parser.error("argument --metrics-interval: give seconds > 0 and at most 86400")
    given = lambda flag: any(a == flag or a.startswith(flag + "=") for a in argv)  # noqa: E731
    if args.metrics_listen_any and not args.metrics_listen:
        where = "argument --metrics-listen-any" if given("--metrics-listen-any") else "EDGE_METRICS_LISTEN_ANY"
        parser.error(f"{where}: it is for --metrics-listen HOST:PORT, which is not set")
    if not args.metrics_listen:
        return
    where = "argument --metrics-listen" if given("--metrics-listen") else "EDGE_METRICS_LISTEN"
    try:
        host, port = parse_listen(args.metrics_listen)
    except ValueError as exc:
        parser.error(f"{where}: {exc}")
    from edge.ipc.curve import is_loopback

    if not args.metrics_listen_any and not is_loopback(f"tcp://[{host}]:{port}"):
        parser.error(f"{where}: {host} accepts connections from other machines and the metrics endpoint has no "
                     f"authentication: listen on 127.0.0.1:{port} (this machine only), or add --metrics-listen-any")
