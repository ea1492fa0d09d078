"""Every setting of the runtime, in one place: the serving record, the command line, ``EDGE_*``.

* :class:`ServingSettings` is the package's ``serving`` section, validated once at boot. It is
  the only source of serving defaults: the scheduler, admission, warm-up, preallocation and
  the engine loop read it through :class:`edge.serving.shapes.BatchShapes`, never a table of
  their own.
* :func:`parse_serve_args` is ``edge serve``'s command line. An ``EDGE_*`` variable is the
  default of its flag; a flag given wins.
* The other ``EDGE_*`` variables, read by code that has no command line (the ORT library
  override, the launcher's exec clock, the bundle's digest), are read here too, by name, from
  :data:`ENVIRONMENT`.

Imported at boot: standard library only (argparse is already paid for by the boot's
command line), no dataclasses.
"""

from __future__ import annotations

import os

from edge.preload.schema import Invalid, Record, dict_of, integer, list_of, number

__all__ = [
    "ENVIRONMENT",
    "ENGINES",
    "DEFAULT_ENGINE",
    "ServingSettings",
    "serve_parser",
    "parse_serve_args",
    "env_address",
    "client_key_files",
    "ort_library_override",
    "exec_boottime_hint_ns",
    "bundle_sha256", "bundle_socket_dir",
    "parse_listen",
]

ENGINES = ("onnxruntime", "torchscript")
DEFAULT_ENGINE = "onnxruntime"
DEFAULT_DRAIN_TIMEOUT_S = 10.0  # SIGTERM to exit; systemd's TimeoutStopSec must exceed it
DEFAULT_CUDA_RESERVE_MB = 512  # upper bound of the up-front CUDA reservation (MiB)
DEFAULT_TELEMETRY_INTERVAL_S = 2.0  # seconds between device telemetry samples (edge.observability.telemetry); 0: off
DEFAULT_METRICS_INTERVAL_S = 15.0  # textfile rewrite period; node_exporter's scrapes are 15-60 s apart

# Every environment variable the runtime reads, and what it sets. docs/ lists the same.
ENVIRONMENT = {
    "EDGE_PACKAGE": "edge serve --package",
    "EDGE_ENGINE": "edge serve --engine",
    "EDGE_DEVICE": "edge serve --device",
    "EDGE_ADDRESS": "the server's address (edge serve --bind) and the clients' (--connect): ipc://PATH, "
                    "tcp://HOST:PORT, a socket path or HOST:PORT",
    "EDGE_BIND": "deprecated alias of EDGE_ADDRESS (read when EDGE_ADDRESS is unset)",
    "EDGE_KEYS": "edge serve --keys",
    "EDGE_SERVER_KEY": "the clients' --server-key (edge embed, health, stats): the server's public key file",
    "EDGE_CLIENT_KEY": "the clients' --client-key (edge embed, health, stats): the client's secret key file",
    "EDGE_TIMELINE": "edge serve --timeline",
    "EDGE_SNAPSHOT_POINT": "edge serve --snapshot-point (1: on)",
    "EDGE_VERIFY": "edge serve --verify",
    "EDGE_DRAIN_TIMEOUT_S": "edge serve --drain-timeout",
    "EDGE_CUDA_RESERVE_MB": "edge serve --cuda-reserve-mb",
    "EDGE_LOG_LEVEL": "edge serve --log-level",
    "EDGE_TELEMETRY_INTERVAL": "edge serve --telemetry-interval",
    "EDGE_METRICS_TEXTFILE": "edge serve --metrics-textfile",
    "EDGE_METRICS_INTERVAL_S": "edge serve --metrics-interval",
    "EDGE_METRICS_LISTEN": "edge serve --metrics-listen",
    "EDGE_METRICS_LISTEN_ANY": "edge serve --metrics-listen-any (1: on)",
    "EDGE_CODE_COMMIT": "the git commit edge was built from, set by the bundle builder; the lineage's edge_commit",
    "EDGE_ORT_LIBRARY": "path of libonnxruntime.so to load instead of the one in the onnxruntime wheel",
    "EDGE_EXEC_BOOTTIME_NS": "CLOCK_BOOTTIME (ns) just before exec, set by a launcher that timed it (edge-coldstart)",
    "EDGE_BUNDLE_SHA256": "the bundle's digest, set in the bundle's config.json; replies carry it in their lineage",
    "EDGE_BUNDLE_SOCKET_DIR": "the bundle's socket directory on the host, set in its config.json; bind errors name it",
}
for _flags in ("edge.observability.journal.options", "edge.serving.breaker_options"):  # their flags' variables (stdlib modules)
    ENVIRONMENT.update(__import__(_flags, fromlist=["ENVIRONMENT"]).ENVIRONMENT)


def _env(name: str, env: dict | None = None) -> str | None:
    if name not in ENVIRONMENT:  # a typo here would read a variable nobody documents
        raise KeyError(f"{name} is not in edge.config.settings.ENVIRONMENT")
    value = (os.environ if env is None else env).get(name)
    return value or None


# ------------------------------------------------------------------ serving


def _ascending(v: object, where: str) -> list[int]:
    items = [integer(x, f"{where}.{i}", ge=1) for i, x in enumerate(list_of(v, where))]
    if not items or items != sorted(set(items)):
        raise Invalid(where, "must be non-empty, positive and strictly ascending")
    return items


def _warm_overrides(v: object, where: str) -> dict:
    """``{"cpu"|"cuda": {"batch_sizes": [..] | null, "repeats": n}}``, each key optional."""
    out = {}
    for kind, spec in dict_of(v, where).items():
        if kind not in ServingSettings.WARM_DEFAULTS:
            raise Invalid(f"{where}.{kind}", f"unknown device kind; known: {', '.join(ServingSettings.WARM_DEFAULTS)}")
        spec = dict_of(spec, f"{where}.{kind}")
        unknown = set(spec) - {"batch_sizes", "repeats"}
        if unknown:
            raise Invalid(f"{where}.{kind}.{sorted(unknown)[0]}", "unexpected field")
        checked = {}
        if spec.get("batch_sizes") is not None:
            checked["batch_sizes"] = _ascending(spec["batch_sizes"], f"{where}.{kind}.batch_sizes")
        elif "batch_sizes" in spec:
            checked["batch_sizes"] = None
        if "repeats" in spec:
            checked["repeats"] = integer(spec["repeats"], f"{where}.{kind}.repeats", ge=1)
        out[kind] = checked
    return out


class ServingSettings(Record):
    """The package's serving settings (manifest ``serving``); every default is here."""

    __slots__ = ("buckets", "batch_sizes", "max_batch_size", "max_batch_tokens", "max_delay_ms",
                 "max_queue_requests", "max_queue_tokens", "max_pending_text_bytes", "default_deadline_ms", "warm",
                 "warm_sample_ids", "extra")
    _defaults = {
        "buckets": lambda: [16, 32, 64, 128, 256],  # tokens per row, ascending
        "batch_sizes": lambda: [1, 2, 4, 8, 16, 32],  # rows a batch may be padded up to (warmed on CUDA)
        "max_batch_size": lambda: 32,  # rows per batch
        "max_batch_tokens": lambda: 8192,  # rows x bucket length per batch (padded tokens)
        "max_delay_ms": lambda: 2.0,  # oldest text's wait before a partial batch goes, engine busy (ms)
        "max_queue_requests": lambda: 1024,  # texts (not requests) admitted and not yet answered
        "max_queue_tokens": lambda: 262144,  # padded tokens (bucket lengths) admitted, not yet answered
        # UTF-8 bytes of texts received and not yet tokenized (bytes): 16 requests of 64 texts of
        # 32 KiB; with tokenizing stopped at the model's maximum, at most ~5 s of tokenizer work.
        "max_pending_text_bytes": lambda: 32 << 20,
        "default_deadline_ms": lambda: 30_000.0,  # ordering key of a request without a deadline (ms)
        "warm": dict,  # per device kind, overrides of WARM_DEFAULTS
        # The warm-up's input: a text tokenized on the build host by this package's own
        # tokenizer (edge.warmup.WARM_TEXT). With it, boot warms up without waiting for the
        # tokenizer to load; None (older packages): boot tokenizes the text itself.
        "warm_sample_ids": lambda: None,
        "extra": dict,  # settings newer writers add; kept so model_dump round-trips them
    }
    # What warm-up runs per device kind. On a CPU kernels need no loading: one run per bucket
    # at batch 1 pages the weights in and sizes the arena. TorchScript's profiling executor
    # specialises after 2-3 calls (measured with MiniLM: a shape's first 2-3 calls run below
    # steady speed), so CUDA runs each shape 3 times, at every batch size a batch can be
    # padded to (None: ``batch_sizes``).
    WARM_DEFAULTS = {
        "cpu": {"batch_sizes": [1], "repeats": 1},
        "cuda": {"batch_sizes": None, "repeats": 3},
    }

    @classmethod
    def model_validate(cls, d: object, where: str = "serving") -> "ServingSettings":
        d = dict(dict_of(d, where))
        known = {}
        for name in ("buckets", "batch_sizes"):
            if name in d:
                known[name] = _ascending(d.pop(name), f"{where}.{name}")
        for name in ("max_batch_size", "max_batch_tokens", "max_queue_requests", "max_queue_tokens",
                     "max_pending_text_bytes"):
            if name in d:
                known[name] = integer(d.pop(name), f"{where}.{name}", ge=1)
        for name in ("max_delay_ms", "default_deadline_ms"):
            if name in d:
                known[name] = number(d.pop(name), f"{where}.{name}", ge=0)
        if "warm" in d:
            known["warm"] = _warm_overrides(d.pop("warm"), f"{where}.warm")
        if d.get("warm_sample_ids") is not None:
            ids = list_of(d.pop("warm_sample_ids"), f"{where}.warm_sample_ids")
            if not ids:
                raise Invalid(f"{where}.warm_sample_ids", "must not be empty")
            known["warm_sample_ids"] = [integer(x, f"{where}.warm_sample_ids.{i}", ge=0) for i, x in enumerate(ids)]
        d.pop("warm_sample_ids", None)
        return cls(**known, extra=d)

    def model_dump(self) -> dict:
        """The JSON form the package builder writes (defaults included, empty overrides left out)."""
        out = {k: getattr(self, k) for k in self.__slots__ if k != "extra"}
        if out["warm_sample_ids"] is None:
            del out["warm_sample_ids"]
        if not out["warm"]:
            del out["warm"]
        out = {k: list(v) if isinstance(v, list) else v for k, v in out.items()}
        return {**out, **self.extra}

    def warm_for(self, kind: str) -> tuple[list[int], int]:
        """(batch sizes, repeats) that warm-up runs per bucket on device kind ``kind``."""
        spec = {**self.WARM_DEFAULTS[kind], **self.warm.get(kind, {})}
        return list(spec["batch_sizes"] or self.batch_sizes), int(spec["repeats"])


# ------------------------------------------------------------------ edge serve


def _number(kind, env_name: str):
    """An argparse type: ``kind`` (int or float), with an error naming the flag's variable too."""
    import argparse

    def convert(text: str):
        try:
            return kind(text)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} (from the flag or {env_name})") from None

    return convert


# The flags whose value is one of a few words: (flag's dest, choices, variable).
_CHOICES = (("engine", ENGINES, "EDGE_ENGINE"), ("device", ("auto", "cpu", "cuda"), "EDGE_DEVICE"),
            ("verify", ("full", "size"), "EDGE_VERIFY"),
            ("log_level", ("debug", "info", "warning", "error"), "EDGE_LOG_LEVEL"))


def serve_parser(env: dict | None = None):
    """``edge serve``'s parser; each flag's default is its ``EDGE_*`` variable."""
    import argparse

    e = lambda name, default=None: _env(name, env) or default  # noqa: E731
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
    for flags in ("edge.observability.journal.options", "edge.serving.breaker_options"):  # docs/trace.md, docs/breaker.md
        __import__(flags, fromlist=["add_serve_arguments"]).add_serve_arguments(p, e)
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


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT``, ``:PORT`` or ``PORT`` as (host, port); no host: 127.0.0.1;
    port 0: one the kernel picks (the ``metrics.started`` log line names it). ValueError says
    what is wrong."""
    host, sep, port = text.strip().rpartition(":")
    if not sep:
        host = ""
    if host.count(":") and not host.startswith("["):
        raise ValueError(f"{text!r}: write an IPv6 host in brackets, e.g. [::1]:9464")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{text!r}: port {port!r} is not a number in 0..65535")
    return host, int(port)


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


# ------------------------------------------------------------------ other EDGE_* variables


def env_address(env: dict | None = None) -> str | None:
    """The address the server binds and clients connect to, when no flag names one."""
    return _env("EDGE_ADDRESS", env) or _env("EDGE_BIND", env)


def client_key_files(env: dict | None = None) -> tuple[str | None, str | None]:
    """The clients' key files when no flag names them: (EDGE_SERVER_KEY, EDGE_CLIENT_KEY)."""
    return _env("EDGE_SERVER_KEY", env), _env("EDGE_CLIENT_KEY", env)


def ort_library_override(env: dict | None = None) -> str | None:
    return _env("EDGE_ORT_LIBRARY", env)


def exec_boottime_hint_ns(env: dict | None = None) -> int | None:
    """A launcher's exec time (CLOCK_BOOTTIME ns), or None when absent or not an integer."""
    value = _env("EDGE_EXEC_BOOTTIME_NS", env)
    try:
        return int(value) if value else None
    except ValueError:
        return None


def bundle_sha256(env: dict | None = None) -> str | None:
    """The digest of the bundle this process runs from (None outside a bundle)."""
    return _env("EDGE_BUNDLE_SHA256", env)


def bundle_socket_dir(env: dict | None = None) -> str | None:  # the host's directory mounted at /run/edge
    return _env("EDGE_BUNDLE_SOCKET_DIR", env)
