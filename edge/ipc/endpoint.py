"""Where the server listens and clients connect: addresses, the default, the ipc:// socket file.

An address is given as ``ipc://PATH``, ``tcp://HOST:PORT``, a bare path (ipc) or ``HOST:PORT``
(tcp), by a flag (``--bind``, ``--connect``) or by ``EDGE_ADDRESS``, which the server and the
clients both read. :func:`normalize_address` turns any of them into the ZeroMQ form or refuses
it with :class:`AddressError`, whose message says what to write instead, before anything starts.

The socket file is what keeps other users out (docs/design.md, "Protocol": "a file the
owner and the group can reach, nothing else"): its directory is made 0750 when we
create it and the file 0660 right after bind.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["AddressError", "normalize_address", "default_address", "default_bind_address", "ipc_path",
           "check_ipc_server", "check_socket_dir", "prepare_ipc_path", "bind_router", "remove_ipc_file",
           "take_over_ipc_file"]

FORMS = "ipc://PATH, tcp://HOST:PORT, a socket path, or HOST:PORT"
MAX_IPC_PATH = 107  # bytes: sun_path of an AF_UNIX address, less its terminating NUL


class AddressError(ValueError):
    """An address that cannot work; the message names the accepted forms."""


def _port(text: str, address: str, bind: bool) -> int:
    if not text.isdigit() or not (0 if bind else 1) <= int(text) <= 65535:
        low = 0 if bind else 1
        raise AddressError(f"{address!r}: port {text!r} is not a number in {low}..65535"
                           + (" (0: any free port)" if bind else ""))
    return int(text)


def _check_host(host: str, address: str, bind: bool) -> None:
    if not host:
        raise AddressError(f"{address!r}: no host before the port; write tcp://HOST:PORT")
    if not bind or host == "*":
        return  # a client resolves when it connects; "*" is every interface
    import socket  # not at module level: boot normalizes its ipc address without it
    try:
        socket.if_nametoindex(host)  # zmq binds an interface name too (eth0)
        return
    except OSError:
        pass
    try:
        socket.getaddrinfo(host.strip("[]"), None)
    except OSError:
        raise AddressError(f"{address!r}: host {host!r} is not an address, a name or an interface of this "
                           f"machine; use 127.0.0.1 (this machine only) or * (every interface)") from None


def _tcp(host: str, port: str, address: str, bind: bool) -> str:
    _check_host(host, address, bind)
    return f"tcp://{host}:{_port(port, address, bind)}"


def normalize_address(text: str, *, bind: bool = False) -> str:
    """``text`` in ZeroMQ's form (``ipc://`` with an absolute path, or ``tcp://HOST:PORT``).

    ``bind``: the server's address (port 0 and host ``*`` allowed, the host must exist here).
    Raises :class:`AddressError` naming the problem and the forms accepted.
    """
    t = (text or "").strip()
    if not t:
        raise AddressError(f"empty address; use {FORMS}")
    scheme, sep, rest = t.partition("://")
    if sep and scheme == "ipc":
        path = rest
    elif sep and scheme == "tcp":
        host, colon, port = rest.rpartition(":")
        if not colon:
            raise AddressError(f"{t!r}: no port; write tcp://HOST:PORT")
        return _tcp(host, port, t, bind)
    elif sep:
        raise AddressError(f"{t!r}: scheme {scheme!r} is not served; use {FORMS}")
    else:
        host, colon, port = t.rpartition(":")
        if colon and port.isdigit() and "/" not in host:  # HOST:PORT
            return _tcp(host, port, t, bind)
        path = t
    if not path:
        raise AddressError(f"{t!r}: no socket path; write ipc:///run/edge/edge.sock or a path")
    if not path.startswith("@"):  # "@name": Linux's abstract namespace, no file
        path = os.path.abspath(os.path.expanduser(path))
    if len(path.encode()) > MAX_IPC_PATH:
        raise AddressError(f"{t!r}: a socket path holds at most {MAX_IPC_PATH} bytes, this one "
                           f"{len(path.encode())}; choose a shorter directory")
    return f"ipc://{path}"


def default_address(env: dict | None = None) -> str:
    """``$EDGE_ADDRESS``, else ``ipc://$XDG_RUNTIME_DIR/edge/edge.sock``, else ``ipc:///run/edge/edge.sock``."""
    from edge.config.env import env_address

    address = env_address(env)  # env None: the process's environment, as below
    if address:
        return address
    base = (os.environ if env is None else env).get("XDG_RUNTIME_DIR")
    return f"ipc://{os.path.join(base, 'edge')}/edge.sock" if base else "ipc:///run/edge/edge.sock"


def default_bind_address(env: dict | None = None) -> str:
    """:func:`default_address`, by its name from before the server and the clients shared it."""
    return default_address(env)


def check_ipc_server(address: str) -> None:
    """For a client: refuse at once an ipc address whose socket file does not exist.

    ZeroMQ would connect lazily and the request would only time out; a missing file means
    no server has ever bound there (or it stopped and removed it).
    """
    path = ipc_path(address)
    if path is None or path.startswith("@"):
        return
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, f"no server at {address}: the socket file does not exist "
                                f"(is `edge serve` running? check --connect or EDGE_ADDRESS)", path)
    if not stat.S_ISSOCK(os.stat(path).st_mode):
        raise FileNotFoundError(errno.ENOTSOCK, f"{path} is not a socket; --connect names the server's socket file",
                                path)


def ipc_path(address: str) -> str | None:
    return address[len("ipc://"):] if address.startswith("ipc://") else None


def check_socket_dir(d: str) -> None:
    """Refuse a socket directory that someone other than us or root could change.

    Whoever can write the directory can remove our socket file and bind their own in its place,
    then read every request and forge every reply. So the directory (and the link to it, if it
    is one) must belong to us or root, and must not be writable by group or others unless it is
    sticky (like /tmp: others cannot remove or rename our file there).
    """
    me = os.geteuid()
    link = os.lstat(d)
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (me, 0):
        raise PermissionError(errno.EPERM, f"the socket directory is a symlink owned by uid {link.st_uid}; "
                              f"bind in a directory of your own (or root's)", d)
    st = os.stat(d)
    if st.st_uid not in (me, 0):
        raise PermissionError(errno.EPERM, f"the socket directory belongs to uid {st.st_uid}, not to this "
                              f"process (uid {me}) or root; bind in a directory of your own", d)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise PermissionError(errno.EPERM, f"the socket directory is writable by others (mode "
                              f"{stat.S_IMODE(st.st_mode):04o}): they could replace the socket; "
                              f"chmod go-w it, or bind elsewhere", d)


def _lock(path: str) -> int:
    """Hold ``PATH.lock`` (an open file descriptor) for the server's life."""
    import fcntl

    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise OSError(errno.EADDRINUSE, "another edge server is starting or serving on this address", path) from None
    return fd


def prepare_ipc_path(path: str) -> int:
    """Make the socket's place ready; returns the address lock's descriptor, to keep open.

    Creates the directory (0750) if missing, refuses one others can change, takes the lock
    ``PATH.lock`` (two servers starting at the same moment would otherwise both see no socket,
    and the second's bind would unlink the first's), removes a stale socket file and refuses a
    live one.
    """
    d = os.path.dirname(path) or "."
    if not os.path.isdir(d):
        os.makedirs(d, mode=0o750, exist_ok=True)
        os.chmod(d, 0o750)  # makedirs' mode is filtered by the umask
    check_socket_dir(d)
    lock = _lock(path)
    try:
        _remove_stale_socket(path)
    except BaseException:
        os.close(lock)
        raise
    return lock


def _remove_stale_socket(path: str) -> None:
    if not os.path.lexists(path):
        return
    if not stat.S_ISSOCK(os.lstat(path).st_mode):
        raise FileExistsError(errno.EEXIST, "exists and is not a socket; refusing to replace it", path)
    import socket

    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # left by a server that is gone
    else:
        raise OSError(errno.EADDRINUSE, "another server is listening on this socket", path)
    finally:
        probe.close()


def bind_router(router, address: str) -> tuple[str, int | None]:
    """Bind a ZeroMQ socket at ``address`` (after :func:`prepare_ipc_path` for ipc); returns the
    endpoint bound (a tcp port 0 resolved) and the ipc socket file's inode (None for tcp).

    The socket file is created 0660 (owner and group) by the umask itself: a chmod after bind
    would leave a window in which anyone could connect.
    """
    import zmq

    path = ipc_path(address)
    umask = os.umask(0o117) if path else None
    try:
        router.bind(address)
    finally:
        if umask is not None:
            os.umask(umask)
    if path is None:
        return router.getsockopt_string(zmq.LAST_ENDPOINT), None
    os.chmod(path, 0o660)  # a no-op now; kept should a platform ignore the umask for sockets
    return router.getsockopt_string(zmq.LAST_ENDPOINT), os.stat(path).st_ino


def remove_ipc_file(path: str, inode: int) -> bool:
    """Unlink our socket file, unless another server has bound a new one there since (or took the
    name over: :func:`take_over_ipc_file`); False when the file there is another's."""
    try:
        if os.stat(path).st_ino != inode:
            return False
        os.unlink(path)
    except FileNotFoundError:
        pass
    return True


def take_over_ipc_file(own: str, inode: int, live: str) -> None:
    """Rename our socket file ``own`` over ``live``, the address the clients use, at once: a client
    connecting finds the old server's file or ours, never none (``rename(2)`` replaces atomically).
    The old server keeps its open connections; it removes only a file with its own inode
    (:func:`remove_ipc_file`), so its stop leaves ours. Raises OSError when ``own`` is not ours."""
    if os.stat(own).st_ino != inode:
        raise OSError(errno.EEXIST, "the socket file is no longer this server's", own)
    if os.path.dirname(own) != os.path.dirname(live):
        raise OSError(errno.EXDEV, f"{own} and {live} are not in one directory", own)
    os.rename(own, live)
