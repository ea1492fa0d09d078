"""Where the server listens: the default address and the ipc:// socket file.

The socket file is what keeps other users out (DESIGN.md: "a file the owner
and the group can reach, nothing else"): its directory is made 0750 when we
create it and the file 0660 right after bind.
"""

from __future__ import annotations

import errno
import os
import socket
import stat

__all__ = ["default_bind_address", "ipc_path", "prepare_ipc_path", "remove_ipc_file"]


def default_bind_address(env: dict | None = None) -> str:
    """``$EDGE_ADDRESS``, else ``ipc://$XDG_RUNTIME_DIR/edge/edge.sock``, else ``ipc:///run/edge/edge.sock``."""
    from edge.settings import env_address

    env = os.environ if env is None else env
    if env_address(env):
        return env_address(env)
    base = env.get("XDG_RUNTIME_DIR")
    return f"ipc://{os.path.join(base, 'edge')}/edge.sock" if base else "ipc:///run/edge/edge.sock"


def ipc_path(address: str) -> str | None:
    return address[len("ipc://"):] if address.startswith("ipc://") else None


def prepare_ipc_path(path: str) -> None:
    """Create the directory (0750) if missing; remove a stale socket file; refuse a live one."""
    d = os.path.dirname(path) or "."
    if not os.path.isdir(d):
        os.makedirs(d, mode=0o750, exist_ok=True)
        os.chmod(d, 0o750)  # makedirs' mode is filtered by the umask
    if not os.path.lexists(path):
        return
    if not stat.S_ISSOCK(os.lstat(path).st_mode):
        raise FileExistsError(errno.EEXIST, "exists and is not a socket; refusing to replace it", path)
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # left by a server that is gone
    else:
        raise OSError(errno.EADDRINUSE, "another server is listening on this socket", path)
    finally:
        probe.close()


def remove_ipc_file(path: str, inode: int) -> None:
    """Unlink our socket file, unless another server has bound a new one there since."""
    try:
        if os.stat(path).st_ino == inode:
            os.unlink(path)
    except FileNotFoundError:
        pass
