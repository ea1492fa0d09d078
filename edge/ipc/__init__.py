"""Serving over ZeroMQ: wire messages (protocol), the server, a client.

Names are loaded on first use, so ``import edge.ipc.protocol`` (a client) does
not pay for the server's imports.
"""

from __future__ import annotations

import importlib

__all__ = ["IpcServer", "Lifecycle", "default_bind_address", "EdgeClient", "EmbedResult", "default_address",
           "normalize_address", "AddressError"]

_WHERE = {
    "IpcServer": "edge.ipc.server",
    "Lifecycle": "edge.ipc.server",
    "default_bind_address": "edge.ipc.server",
    "EdgeClient": "edge.ipc.client",
    "EmbedResult": "edge.ipc.client",
    "default_address": "edge.ipc.endpoint",
    "normalize_address": "edge.ipc.endpoint",
    "AddressError": "edge.ipc.endpoint",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'edge.ipc' has no attribute {name!r}")
