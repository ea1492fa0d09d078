"""``edge keys generate``: the CURVE keys of a tcp:// server and of its clients.

    edge keys generate --out DIR                 # the server's pair, an empty DIR/authorized_clients
    edge keys generate --out DIR --client NAME   # a client's pair in DIR/clients, its public key authorised

The layout is :mod:`edge.ipc.curve`'s (ZeroMQ's certificate files, ``zmq.auth.create_certificates``):
directories 0700, secret files 0600, public files 0644. Existing keys are never replaced
without ``--force``: a new server key locks out every client holding the old one, and a
client's new pair makes its old secret useless. The server reads ``authorized_clients`` when
it binds, so a client added or removed takes effect at the server's next start.
"""

from __future__ import annotations

import os
import re
import sys

from edge.ipc.curve import AUTHORIZED, CLIENTS, SERVER_PUBLIC, SERVER_SECRET

__all__ = ["add_parser", "generate", "run", "KeysError"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class KeysError(Exception):
    """A usage mistake: the message says what to change (exit 2)."""


def add_parser(sub, epilog: str) -> None:
    """``edge keys`` and its subcommand ``generate``, on the ``edge`` command's subparsers."""
    about = "CURVE keys for a tcp:// server and its clients (docs/protocol.md, \"TCP and CURVE\")"
    k = sub.add_parser("keys", help="CURVE keys for a tcp:// server and its clients", description=about, epilog=epilog)
    ksub = k.add_subparsers(dest="keys_command", required=True, metavar="COMMAND")
    g = ksub.add_parser("generate", help="write a server key pair (or, with --client, a client's) under DIR",
                        description="Write a server key pair and the directory of authorised client keys, or with "
                                    "--client a client key pair, authorised.", epilog=epilog)
    g.add_argument("--out", required=True, metavar="DIR",
                   help="key directory: DIR/server.key (public), DIR/server.key_secret, DIR/authorized_clients/, "
                        "DIR/clients/; created 0700")
    g.add_argument("--client", metavar="NAME", default=None,
                   help="add client NAME: DIR/clients/NAME.key and NAME.key_secret, and its public key in "
                        "DIR/authorized_clients (the server key pair is written too if DIR has none)")
    g.add_argument("--force", action="store_true", help="replace keys that exist (the server's, or client NAME's)")


def _mkdir(path: str) -> bool:
    """Make ``path`` a 0700 directory; True when it was created. An existing one that others can
    reach is tightened only when empty (nothing else is disturbed), else refused."""
    if os.path.isdir(path):
        mode = os.stat(path).st_mode & 0o777
        if mode & 0o077:
            if os.listdir(path):
                raise KeysError(f"{path} is open to other users (mode {mode:04o}) and not empty: `chmod 700 {path}`, "
                                f"or choose a new directory")
            os.chmod(path, 0o700)
        return False
    if os.path.lexists(path):
        raise KeysError(f"{path} exists and is not a directory")
    os.makedirs(path, mode=0o700)
    os.chmod(path, 0o700)  # makedirs' mode is filtered by the umask
    return True


def _pair(directory: str, name: str) -> tuple[str, str]:
    """A new key pair NAME.key (0644) and NAME.key_secret (0600) in ``directory``."""
    from edge.ipc.curve import create_key_files

    umask = os.umask(0o077)  # the secret is never readable by others, not even for a moment
    try:
        public, secret = create_key_files(directory, name)
    finally:
        os.umask(umask)
    os.chmod(public, 0o644)
    os.chmod(secret, 0o600)
    return public, secret


def _refuse_existing(paths: list[str], force: bool, what: str) -> None:
    existing = [p for p in paths if os.path.lexists(p)]
    if existing and not force:
        raise KeysError(f"{existing[0]} exists: refusing to replace {what} (--force replaces it)")


def generate(out: str, client: str | None = None, force: bool = False) -> list[tuple[str, str]]:
    """Write the keys; returns (path, what it is) for each file or directory written."""
    out = os.path.abspath(out)
    if client is not None and not _NAME.fullmatch(client):
        raise KeysError(f"--client {client!r}: a name of letters, digits, '.', '_' or '-', starting with a letter or "
                        f"a digit (at most 64 characters)")
    server_pub, server_sec = os.path.join(out, SERVER_PUBLIC), os.path.join(out, SERVER_SECRET)
    have_server = os.path.exists(server_pub) and os.path.exists(server_sec)
    new_server = client is None or not have_server
    if client is None:
        _refuse_existing([server_pub, server_sec], force, "the server's keys, which every client holds")
    else:
        _refuse_existing([os.path.join(out, CLIENTS, f"{client}.{ext}") for ext in ("key", "key_secret")]
                         + [os.path.join(out, AUTHORIZED, f"{client}.key")], force, f"the keys of client {client!r}")
        if not have_server and (os.path.lexists(server_pub) or os.path.lexists(server_sec)):
            raise KeysError(f"{out} holds half a server key pair: `edge keys generate --out {out} --force` writes "
                            f"a new one (clients then need the new {SERVER_PUBLIC})")
    written = []
    if _mkdir(out):
        written.append((out + "/", "the key directory (0700)"))
    if _mkdir(os.path.join(out, AUTHORIZED)):
        written.append((os.path.join(out, AUTHORIZED) + "/", "the public keys of the clients the server accepts"))
    if new_server:
        pub, sec = _pair(out, "server")
        written += [(pub, "the server's public key: give it to clients (--server-key)"
                          + ("; it replaced the old one, which clients must drop" if have_server else "")),
                    (sec, "the server's key pair (0600): the server's only")]
    if client is not None:
        clients = os.path.join(out, CLIENTS)
        _mkdir(clients)
        pub, sec = _pair(clients, client)
        authorized = os.path.join(out, AUTHORIZED, f"{client}.key")
        with open(pub, "rb") as src:
            data = src.read()
        fd = os.open(authorized, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as dst:
            dst.write(data)
        os.chmod(authorized, 0o644)
        written += [(pub, f"client {client}'s public key"),
                    (sec, f"client {client}'s key pair (0600): copy it to that client only (--client-key)"),
                    (authorized, f"client {client} authorised: the server accepts it from its next start")]
    return written


def _usage(out: str, client: str | None) -> list[str]:
    server_pub = os.path.join(out, SERVER_PUBLIC)
    lines = ["", "serve (tcp:// only; restart the server after adding or removing a client):",
             f"  edge serve --bind tcp://HOST:PORT --keys {out}"]
    if client is None:
        lines += ["add a client (nobody can connect until one is authorised):",
                  f"  edge keys generate --out {out} --client NAME"]
    else:
        secret = os.path.join(out, CLIENTS, f"{client}.key_secret")
        lines += [f"connect as {client} (or set EDGE_SERVER_KEY and EDGE_CLIENT_KEY):",
                  f"  edge health --connect tcp://HOST:PORT --server-key {server_pub} --client-key {secret}"]
    return lines


def run(args) -> int:
    """``edge keys ...`` from the parsed command line; the exit status."""
    try:
        written = generate(args.out, args.client, args.force)
    except KeysError as exc:
        sys.stderr.write(f"edge keys generate: {exc}\n")
        return 2
    except OSError as exc:
        sys.stderr.write(f"edge keys generate: {exc.filename or args.out}: {exc.strerror or exc}\n")
        return 2
    for path, what in written:
        sys.stdout.write(f"wrote {path}  ({what})\n")
    sys.stdout.write("\n".join(_usage(os.path.abspath(args.out), args.client)) + "\n")
    return 0
