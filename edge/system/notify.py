"""sd_notify: tell systemd (or runc, which forwards it) about our state.

The protocol is one datagram per message on the AF_UNIX socket named by
``$NOTIFY_SOCKET``; a leading ``@`` means the Linux abstract namespace.
No dependency on libsystemd: the device image does not ship it.
"""

from __future__ import annotations

import os

__all__ = ["notify", "notify_socket_path"]


def notify_socket_path(env: dict | None = None) -> str | None:
    path = (env if env is not None else os.environ).get("NOTIFY_SOCKET")
    if not path:
        return None
    if path.startswith("@"):
        return "\0" + path[1:]
    return path


def notify(*fields: str) -> bool:
    """Send ``fields`` (e.g. "READY=1", "STATUS=serving") as one datagram.

    Returns False when no notify socket is configured. Errors sending are
    swallowed on purpose: a missing supervisor must never stop the runtime,
    and systemd's own start timeout catches a READY that never arrived.
    """
    path = notify_socket_path()
    if path is None:
        return False
    import socket  # here, not at module level: only the READY and STOPPING messages need it

    message = "\n".join(fields).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(path)
            sock.sendall(message)
    except OSError:
        return False
    return True
