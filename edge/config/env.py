"""Every ``EDGE_*`` variable the runtime reads, in one registry, and the one function that reads them.

A variable is read by name through :func:`env_value`, which refuses a name the registry does
not document: a typo would otherwise read a variable nobody sets. ``edge serve``'s flags take
their defaults from here (:mod:`edge.runtime.serve_args`); code with no command line (the ORT
library override, the launcher's exec clock, the bundle's digest) reads its variable here too.
docs/commands.md lists the same table (image/docs_options.py writes it from this one).

The bottom layer: standard library only, imported at boot.
"""

from __future__ import annotations

import os

__all__ = ["ENVIRONMENT", "env_value", "DEFAULT_ENGINE", "DEFAULT_DRAIN_TIMEOUT_S", "DEFAULT_CUDA_RESERVE_MB",
           "DEFAULT_TELEMETRY_INTERVAL_S", "DEFAULT_METRICS_INTERVAL_S", "env_address", "client_key_files", "ort_library_override",
           "exec_boottime_hint_ns", "bundle_sha256", "bundle_socket_dir"]

# Defaults of variables that code without `edge serve`'s parser reads too (the telemetry sampler's
# interval) or that the docs quote; the parser's flags take theirs from here.
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
    "EDGE_ORT_PREPACKING": "edge serve --ort-prepacking",
    "EDGE_WARM_UP": "edge serve --warm-up",
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
    # the request journal's (edge.observability.journal.options; docs/trace.md)
    "EDGE_STATE_DIR": "edge serve --state-dir, and where edge trace --state-dir looks by default",
    "EDGE_JOURNAL_DIR": "edge serve --journal-dir (off: no journal), and edge trace --journal-dir",
    "EDGE_JOURNAL_MAX_BYTES": "edge serve --journal-max-bytes",
    "EDGE_KEEP_REJECTED": "edge serve --keep-rejected",
    # the circuit breaker's, its fallback's and fault injection's (edge.serving.breaker_options; docs/breaker.md)
    "EDGE_BREAKER_THRESHOLD": "edge serve --breaker-threshold",
    "EDGE_BREAKER_COOLDOWN_S": "edge serve --breaker-cooldown",
    "EDGE_BREAKER_PROBES": "edge serve --breaker-probes",
    "EDGE_FALLBACK": "edge serve --fallback (auto: the package's declared fallback; off: none)",
    "EDGE_FAULT_ENGINE_DELAY_MS": "edge serve --fault-engine-delay-ms (testing: delay every primary engine run)",
    "EDGE_FAULT_ENGINE_ERROR_RATE": "edge serve --fault-engine-error-rate (testing: fail this share of primary runs)",
}


def env_value(name: str, env: dict | None = None) -> str | None:
    """The value of variable ``name`` (of ``env``, else the process's), None when unset or empty."""
    if name not in ENVIRONMENT:  # a typo here would read a variable nobody documents
        raise KeyError(f"{name} is not in edge.config.env.ENVIRONMENT")
    value = (os.environ if env is None else env).get(name)
    return value or None


def env_address(env: dict | None = None) -> str | None:
    """The address the server binds and clients connect to, when no flag names one."""
    return env_value("EDGE_ADDRESS", env) or env_value("EDGE_BIND", env)


def client_key_files(env: dict | None = None) -> tuple[str | None, str | None]:
    """The clients' key files when no flag names them: (EDGE_SERVER_KEY, EDGE_CLIENT_KEY)."""
    return env_value("EDGE_SERVER_KEY", env), env_value("EDGE_CLIENT_KEY", env)


def ort_library_override(env: dict | None = None) -> str | None:
    return env_value("EDGE_ORT_LIBRARY", env)


def exec_boottime_hint_ns(env: dict | None = None) -> int | None:
    """A launcher's exec time (CLOCK_BOOTTIME ns), or None when absent or not an integer."""
    value = env_value("EDGE_EXEC_BOOTTIME_NS", env)
    try:
        return int(value) if value else None
    except ValueError:
        return None


def bundle_sha256(env: dict | None = None) -> str | None:
    """The digest of the bundle this process runs from (None outside a bundle)."""
    return env_value("EDGE_BUNDLE_SHA256", env)


def bundle_socket_dir(env: dict | None = None) -> str | None:  # the host's directory mounted at /run/edge
    return env_value("EDGE_BUNDLE_SOCKET_DIR", env)
