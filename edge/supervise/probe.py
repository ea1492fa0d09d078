"""The supervisor's health probe: ZMTP 3.0 DEALER, just enough for one request (rfc.zeromq.org/spec/23).

No ZeroMQ on the host: the probe speaks ZMTP itself, with JSON frames, which the server answers in JSON.
"""

import json
import socket


def _zmtp_frame(data, more=False, command=False):
    flags = (0x01 if more else 0) | (0x04 if command else 0)
    if len(data) > 255:
        return bytes([flags | 0x02]) + len(data).to_bytes(8, "big") + data
    return bytes([flags, len(data)]) + data


def _recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        buf += chunk
    return buf


def _recv_frame(sock):
    flags = _recv_exact(sock, 1)[0]
    size = int.from_bytes(_recv_exact(sock, 8), "big") if flags & 0x02 else _recv_exact(sock, 1)[0]
    return flags, _recv_exact(sock, size)


def zmtp_request(path, frames, timeout_s=3.0):
    """Send ``frames`` as one message to a ZeroMQ ROUTER at the ipc ``path``; return the reply frames."""
    greeting = b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\x00") + b"\x00" * 32
    ready = bytes([5]) + b"READY" + bytes([11]) + b"Socket-Type" + (6).to_bytes(4, "big") + b"DEALER"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(path)
        sock.sendall(greeting)
        peer = _recv_exact(sock, 64)
        if peer[0] != 0xFF or peer[9] != 0x7F or peer[10] < 3:
            raise ConnectionError("the peer does not speak ZMTP 3")
        sock.sendall(_zmtp_frame(ready, command=True))
        sock.sendall(b"".join(_zmtp_frame(f, more=i < len(frames) - 1) for i, f in enumerate(frames)))
        reply = []
        while True:
            flags, data = _recv_frame(sock)
            if flags & 0x04:  # a command (the peer's READY): not part of the message
                continue
            reply.append(data)
            if not flags & 0x01:
                return reply


def probe(address, timeout_s=3.0):
    """(ready, detail) from the runtime's ``health`` reply at ``ipc://PATH``."""
    if not address.startswith("ipc://"):
        return False, f"only ipc:// addresses can be probed, not {address}"
    try:
        reply = zmtp_request(address[len("ipc://"):], [json.dumps({"v": 1, "type": "health"}).encode(), b"{}"],
                             timeout_s)
        header, body = json.loads(reply[0]), json.loads(reply[1])
    except (OSError, ValueError, IndexError) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    if header.get("type") != "health":
        return False, f"reply {header.get('type')}: {body.get('message')}"
    return bool(body.get("ready")), body.get("state", "ready" if body.get("ready") else "not ready")
