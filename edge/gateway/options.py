"""``edge gateway``'s command line and the checks made before anything starts.

Standard library only (no aiohttp), so ``edge gateway --help``, the docs generator and a usage
error cost no HTTP stack import.
"""

from __future__ import annotations

import argparse
import ipaddress
from dataclasses import dataclass

from edge.config.argtypes import positive_number
from edge.config.command_line import UsageError, exit_epilog

__all__ = ["EXIT_CODES", "Listen", "gateway_parser", "parse_listen", "check_exposure", "read_api_key"]

EXIT_CODES = {
    0: "stopped by SIGTERM or SIGINT after serving",
    2: "usage error: a bad flag, a non-loopback --listen without --api-key-file or TLS, an unreadable key file",
    3: "the listener could not be opened (address in use, no permission)",
}

_seconds = positive_number("seconds")
_ms = positive_number("ms")


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


@dataclass(frozen=True)
class Listen:
    host: str
    port: int

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False  # a host name other than localhost: whatever it resolves to, treat as exposed


def parse_listen(text: str) -> Listen:
    """``HOST:PORT``, ``[V6]:PORT`` or ``:PORT`` (all interfaces)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"--listen {text!r}: expected HOST:PORT (e.g. 127.0.0.1:8080)")
    host = host.strip("[]") or "0.0.0.0"
    if host == "*":
        host = "0.0.0.0"
    return Listen(host, int(port))


def check_exposure(listen: Listen, api_key_file: str | None, tls: bool) -> None:
    """Listening beyond loopback needs a bearer token or TLS: anyone on the network could embed."""
    if not listen.loopback and not api_key_file and not tls:
        raise UsageError(f"--listen {listen.host}:{listen.port} is not a loopback address: anyone who can reach it "
                         "could embed. Give --api-key-file FILE (a bearer token) or --tls-cert/--tls-key, or both; "
                         "or listen on 127.0.0.1")


def read_api_key(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            key = f.read().strip()
    except OSError as exc:
        raise UsageError(f"--api-key-file {path}: {exc.strerror}") from None
    if len(key) < 16:
        raise UsageError(f"--api-key-file {path}: the token must be at least 16 characters (it has {len(key)})")
    return key


def gateway_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="edge gateway",
        description="HTTP front of the runtime: the OpenAI embeddings API (POST /v1/embeddings, GET /v1/models) "
                    "and Hugging Face TEI's (POST /embed, GET /info), /health and /metrics; a client of the "
                    "runtime's ZeroMQ socket, in a process of its own (docs/gateway.md)",
        epilog=exit_epilog(EXIT_CODES))
    p.add_argument("--listen", default="127.0.0.1:8080", metavar="HOST:PORT",
                   help="HTTP address (default 127.0.0.1:8080, loopback only); any other address needs "
                        "--api-key-file or --tls-cert/--tls-key")
    p.add_argument("--connect", metavar="ADDR", default=None,
                   help="the runtime's address (default: $EDGE_ADDRESS, else ipc://$XDG_RUNTIME_DIR/edge/edge.sock, "
                        "else ipc:///run/edge/edge.sock)")
    p.add_argument("--server-key", metavar="FILE", default=None,
                   help="a tcp:// runtime started with --keys: its public key file (with --client-key)")
    p.add_argument("--client-key", metavar="FILE", default=None,
                   help="with --server-key: this gateway's secret key file, authorised by the runtime")
    p.add_argument("--api-key-file", metavar="FILE", default=None,
                   help="require `Authorization: Bearer TOKEN` on every endpoint but /health; the file holds the "
                        "token (16 characters at least), compared in constant time")
    p.add_argument("--tls-cert", metavar="FILE", default=None, help="serve HTTPS with this certificate chain (PEM)")
    p.add_argument("--tls-key", metavar="FILE", default=None, help="the private key of --tls-cert (PEM)")
    p.add_argument("--pool-size", type=_count, default=4, metavar="N",
                   help="DEALER connections to the runtime, each with many requests in flight (default 4)")
    p.add_argument("--deadline-ms", type=_ms, default=30000.0, metavar="MS",
                   help="deadline forwarded with each request to the runtime; past it the client gets 504 "
                        "(default 30000)")
    p.add_argument("--max-body-bytes", type=_count, default=4 << 20, metavar="BYTES",
                   help="largest request body (default 4194304); over it: 413")
    p.add_argument("--max-inputs", type=_count, default=2048, metavar="N",
                   help="inputs per HTTP request (default 2048, OpenAI's own limit); split into runtime requests "
                        "of 64 texts")
    p.add_argument("--max-connections", type=_count, default=256, metavar="N",
                   help="HTTP connections held at once (default 256); over it a new one gets 503 and is closed")
    p.add_argument("--body-timeout", type=_seconds, default=10.0, metavar="SECONDS",
                   help="time to receive a request's body (default 10); past it: 408")
    p.add_argument("--idle-timeout", type=_seconds, default=15.0, metavar="SECONDS",
                   help="a connection with no request in progress (idle keep-alive, or headers still arriving) "
                        "is closed after this long (default 15)")
    p.add_argument("--model-name", default=None, metavar="NAME",
                   help="the model id reported by /v1/models, /info and replies (default: the package's name, "
                        "from the runtime's stats)")
    p.add_argument("--log-level", choices=("debug", "info", "warning"), default="info")
    return p
