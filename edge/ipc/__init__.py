"""Serving over ZeroMQ: wire messages (protocol), the server, a client.

Names are loaded on first use, so ``import edge.ipc.protocol`` (a client) does
not pay for the server's imports.
"""

from __future__ import annotations

import importlib

__all__ = ["IpcServer", "Lifecycle", "default_bind_address", "EdgeClient", "EmbedResult"]

_WHERE = {
    "IpcServer": "edge.ipc.server",
    "Lifecycle": "edge.ipc.server",
    "default_bind_address": "edge.ipc.server",
    "EdgeClient": "edge.ipc.client",
    "EmbedResult": "edge.ipc.client",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'edge.ipc' has no attribute {name!r}")
