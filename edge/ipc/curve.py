"""ZeroMQ CURVE on tcp://: ``edge serve --keys DIR`` and the clients' ``--server-key`` / ``--client-key``.

An ipc socket is guarded by its file's mode (``edge/ipc/endpoint.py``); TCP has no such
thing: every local user reaches 127.0.0.1, and the network reaches 0.0.0.0. With keys the
server's ROUTER is a CURVE server (the traffic is encrypted) and a ZAP handler
(:mod:`edge.ipc.zap`) on the server's context accepts only the client public keys found in
``DIR/authorized_clients`` when the server binds. A client without keys, or with a key that is
not there, gets no reply: the handshake fails and libzmq tells neither application.

The key directory (``edge keys generate``, ``edge/commands/keys.py``; ZeroMQ's certificate files)::

    DIR/                      0700
      server.key              the server's public key: give it to every client (--server-key)
      server.key_secret       the server's key pair, 0600: the server's only
      authorized_clients/     0700; NAME.key: the public keys the server accepts (read at bind)
      clients/                0700; NAME.key, NAME.key_secret (0600): a client's pair (--client-key)

Imported at boot for :func:`server_curve` (standard library only); the key files' reader
(zmq.auth.certs) and the ZAP handler are imported only when keys are used.
"""

from __future__ import annotations

import glob
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edge.ipc.zap import ZapHandler

__all__ = ["SERVER_PUBLIC", "SERVER_SECRET", "AUTHORIZED", "CLIENTS", "KeyFileError", "is_loopback", "create_key_files",
           "load_key_file", "ServerCurve", "server_curve", "ClientCurve", "client_curve"]

SERVER_PUBLIC = "server.key"
SERVER_SECRET = "server.key_secret"
AUTHORIZED = "authorized_clients"
CLIENTS = "clients"
Z85_KEY_LEN = 40  # characters of a CURVE key in Z85 (32 bytes)
_KEYS_SETTING = "--keys DIR (`edge keys generate --out DIR` writes one)"


class KeyFileError(ValueError):
    """A key file that is missing, unreadable or not a ZeroMQ certificate; the message names it."""


def is_loopback(address: str) -> bool:
    """True for a tcp:// address on 127.0.0.0/8, ::1 or localhost: only this machine connects."""
    if not address.startswith("tcp://"):
        return False
    host = address[len("tcp://"):].rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name, an interface, "*"
        return False


def create_key_files(directory: str, name: str) -> tuple[str, str]:
    """A new CURVE key pair as zmq.auth writes it: (DIR/NAME.key, DIR/NAME.key_secret); the file
    modes are the caller's (``edge keys``)."""
    import zmq.auth

    return zmq.auth.create_certificates(directory, name)


def load_key_file(path: str, *, secret: bool, what: str) -> tuple[bytes, bytes | None]:
    """(public key, secret key or None) of a ZeroMQ certificate file, Z85-encoded.

    ``secret``: the file must hold the secret key too. :class:`KeyFileError` names ``what``
    and the file.
    """
    from zmq.auth.certs import load_certificate

    if not os.path.isfile(path):
        raise KeyFileError(f"{what} {path}: " + ("not a file" if os.path.exists(path) else "no such file"))
    try:
        public, secret_key = load_certificate(path)
    except OSError as exc:
        raise KeyFileError(f"{what} {path}: cannot be read ({exc.strerror or exc})") from None
    except ValueError:
        raise KeyFileError(f"{what} {path}: no public-key line; not a ZeroMQ certificate file") from None
    if secret and secret_key is None:
        raise KeyFileError(f"{what} {path}: holds no secret key; give the .key_secret file")
    if len(public) != Z85_KEY_LEN or (secret_key is not None and len(secret_key) != Z85_KEY_LEN):
        raise KeyFileError(f"{what} {path}: a key is not {Z85_KEY_LEN} Z85 characters")
    return public, secret_key


# ------------------------------------------------------------------ server


class ServerCurve:
    """The server's key pair and its directory of authorised client keys (``--keys DIR``).

    Constructing it reads nothing: :meth:`apply` reads the files inside the boot's ``bind``
    stage, so a missing or unreadable file is a boot error naming it (exit 3).
    """

    def __init__(self, keys_dir: str) -> None:
        self.dir = os.path.abspath(keys_dir)
        self.secret_file = os.path.join(self.dir, SERVER_SECRET)
        self.authorized = os.path.join(self.dir, AUTHORIZED)
        self.public_key: bytes | None = None  # Z85, once applied
        self._auth: ZapHandler | None = None  # the ZAP handler, started by the first apply()

    def apply(self, router, ctx) -> None:
        """Make ``router`` a CURVE server and start the ZAP handler on ``ctx``. Call it before
        ``router.bind``: a connection accepted before the handler runs would skip the check
        (libzmq lets every CURVE client in when no ZAP handler is bound)."""
        from edge.errors import BootError
        from edge.system.log import log

        try:
            public, secret = load_key_file(self.secret_file, secret=True, what="the server's key pair")
            clients = [load_key_file(p, secret=False, what="authorised client key")[0] for p in self._client_files()]
        except KeyFileError as exc:
            raise BootError(str(exc), setting=_KEYS_SETTING) from None
        if self._auth is None:  # a bind() retried on the same server keeps its handler
            from edge.ipc.zap import ZapHandler

            # Its lines (ALLOWED / DENIED with the client's key) reach the JSON log at --log-level debug.
            auth = ZapHandler(ctx)
            auth.start()
            self._auth = auth
        self._auth.configure(clients)
        router.curve_secretkey = secret
        router.curve_publickey = public
        router.curve_server = True
        self.public_key = public
        mode = os.stat(self.secret_file).st_mode & 0o777
        log("serve.curve", keys=self.dir, server_key=public.decode(), authorized_clients=len(clients))
        if mode & 0o077:
            log("serve.keys_readable", level="warning", file=self.secret_file, mode=f"{mode:04o}",
                fix=f"chmod 600 {self.secret_file}: whoever reads it can impersonate the server")
        if not clients:
            log("serve.curve_no_clients", level="warning", directory=self.authorized,
                fix=f"no client can connect: `edge keys generate --out {self.dir} --client NAME`, then restart")

    def _client_files(self) -> list[str]:
        """The files zmq.auth reads (``*.key``); an unreadable directory is an error here, where
        configure_curve would only log it and accept nobody."""
        if not os.path.isdir(self.authorized):
            raise KeyFileError(f"the authorised client keys directory {self.authorized}: no such directory")
        try:
            os.listdir(self.authorized)
        except OSError as exc:
            raise KeyFileError(f"the authorised client keys directory {self.authorized}: cannot be read "
                               f"({exc.strerror})") from None
        return sorted(glob.glob(os.path.join(glob.escape(self.authorized), "*.key")))

    def stop(self) -> bool:
        """Stop the ZAP handler (before the context's term(), which its socket would hold up);
        False (and a warning) if its thread did not end: then term() must not be called."""
        auth, self._auth = self._auth, None
        if auth is None or auth.stop():
            return True
        from edge.system.log import log

        log("serve.zap_stuck", level="warning", why="the ZAP handler's thread did not end; the context is left open")
        return False


def server_curve(keys_dir: str | None, bind: str) -> ServerCurve | None:
    """What ``edge serve`` hands its IpcServer: a :class:`ServerCurve` for tcp:// with ``--keys``,
    else None. tcp:// without keys (loopback: ``parse_serve_args`` refused any other host) is
    logged as a warning: every local user can connect."""
    if not bind.startswith("tcp://"):
        return None  # ipc: the socket file's mode guards it (--keys with ipc is refused at parse)
    if keys_dir:
        return ServerCurve(keys_dir)
    from edge.system.log import log

    log("serve.tcp_unauthenticated", level="warning", address=bind,
        why="TCP without keys: any user of this machine can connect and embed",
        fix="`edge keys generate --out DIR`, then `edge serve --keys DIR` (env EDGE_KEYS)")
    return None


# ------------------------------------------------------------------ client


class ClientCurve:
    """A client's CURVE keys (Z85): the server's public key, the client's key pair."""

    def __init__(self, server_public: bytes, public: bytes, secret: bytes) -> None:
        self.server_public, self.public, self.secret = server_public, public, secret

    @classmethod
    def load(cls, server_key_file: str, client_key_file: str) -> "ClientCurve":
        """From the server's public key file and the client's secret key file (KeyFileError names a bad one)."""
        server_public, _ = load_key_file(server_key_file, secret=False, what="server key")
        public, secret = load_key_file(client_key_file, secret=True, what="client key")
        assert secret is not None  # secret=True: load_key_file refuses a file without one
        return cls(server_public, public, secret)

    def apply(self, sock) -> None:
        """Make ``sock`` a CURVE client of the server; before ``connect``."""
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret


def client_curve(address: str, server_key: str | None, client_key: str | None,
                 env: dict | None = None) -> ClientCurve | None:
    """A command-line client's keys: the flags, else ``EDGE_SERVER_KEY`` / ``EDGE_CLIENT_KEY``;
    None when neither names any. KeyFileError says which flag or variable to change."""
    from edge.config.env import client_key_files

    env_server, env_client = client_key_files(env)
    given = [(server_key, "--server-key"), (client_key, "--client-key")]
    if server_key is None and client_key is None:
        given = [(env_server, "EDGE_SERVER_KEY"), (env_client, "EDGE_CLIENT_KEY")]
    (server_file, server_src), (client_file, client_src) = given
    if server_file is None and client_file is None:
        return None
    if server_file is None or client_file is None:
        missing = server_src if server_file is None else client_src
        raise KeyFileError(f"{missing} is missing: the server key and the client key go together "
                           f"(--server-key DIR/server.key --client-key DIR/clients/NAME.key_secret)")
    if not address.startswith("tcp://"):
        raise KeyFileError(f"{server_src} / {client_src}: keys are for tcp:// addresses, not {address} "
                           f"(an ipc socket is guarded by its file's mode); leave them out")
    try:
        return ClientCurve.load(server_file, client_file)
    except KeyFileError as exc:
        src = server_src if str(exc).startswith("server key") else client_src
        raise KeyFileError(f"{src}: {exc}") from None
