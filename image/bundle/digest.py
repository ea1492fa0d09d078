"""The bundle's digest: one sha256 that names exactly what a bundle runs.

It covers every file and symlink of ``rootfs/`` (path, then content hash or link target, in
path order) and ``config.json`` with the digest's own environment entry left out. The builder
puts it in the container's environment (``EDGE_BUNDLE_SHA256``), so every reply's lineage
names the bundle that produced it, and in ``edge-bundle.json``; ``edge-bundle verify``
recomputes it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

__all__ = ["ENV_NAME", "bundle_digest", "config_digest_entry"]

ENV_NAME = "EDGE_BUNDLE_SHA256"
_CHUNK = 1 << 20


def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _without_digest(config: dict) -> dict:
    config = json.loads(json.dumps(config))  # a deep copy
    env = config.get("process", {}).get("env", [])
    config.setdefault("process", {})["env"] = [e for e in env if not e.startswith(f"{ENV_NAME}=")]
    return config


def bundle_digest(rootfs: Path, config: dict) -> str:
    """sha256 of ``rootfs`` and ``config`` (its digest entry, if any, left out)."""
    h = hashlib.sha256()
    entries = []
    for top, dirs, files in os.walk(rootfs):
        dirs.sort()
        for name in dirs + files:
            path = os.path.join(top, name)
            rel = os.path.relpath(path, rootfs)
            if os.path.islink(path):
                entries.append(f"L {rel} {os.readlink(path)}\n")
            elif name in files and os.path.isfile(path):
                entries.append(f"F {rel} {_file_sha256(path)}\n")
    for line in sorted(entries):
        h.update(line.encode("utf-8", "surrogateescape"))
    h.update(json.dumps(_without_digest(config), sort_keys=True, separators=(",", ":")).encode())
    return h.hexdigest()


def config_digest_entry(config: dict) -> str | None:
    """The digest recorded in ``config``'s environment, or None."""
    for e in config.get("process", {}).get("env", []):
        if e.startswith(f"{ENV_NAME}="):
            return e.split("=", 1)[1]
    return None
