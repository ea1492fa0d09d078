"""Checks the build-host commands make of their arguments before any long work starts.

Shared by ``edge-package``, ``edge-bundle`` and ``edge-tokenizer`` so a mistake reads the same
in each: what is wrong, then what to give instead.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

__all__ = ["writable_dir_problem", "user_ids", "abs_dir", "tcp_address"]


def writable_dir_problem(out: Path) -> str | None:
    """Why no directory can be made beside ``out`` (None: one can): what a build does at its end,
    a staging directory beside ``out`` renamed into place."""
    above = out.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        return f"--out {out}: {above} is a file, not a directory; give an --out under a directory"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(prefix=f".{out.name}.probe-", dir=out.parent))
    except OSError as exc:
        return (f"--out {out}: cannot create a directory in {out.parent} ({exc.strerror or exc}); "
                f"give an --out on a writable filesystem")
    return None


def user_ids(text: str) -> tuple[int, int]:
    """``UID`` or ``UID:GID``: the runtime's ids in a bundle."""
    uid, _, gid = text.partition(":")
    try:
        ids = int(uid), int(gid or uid)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give UID or UID:GID as numbers, e.g. 61000:61000") from None
    if min(ids) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: ids are 0 or more")
    return ids


def abs_dir(text: str) -> str:
    if not os.path.isabs(text):
        raise argparse.ArgumentTypeError(f"{text!r}: give an absolute host path, e.g. /run/edge or /var/lib/node_exporter")
    return text


def tcp_address(text: str) -> str:
    """A bundle's ``--tcp``: tcp://HOST:PORT on loopback (a bundle carries no CURVE keys yet)."""
    from edge.ipc.endpoint import AddressError, normalize_address

    try:  # the form only: the host is the device's, which may not be this build host
        address = normalize_address(text)
    except AddressError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not address.startswith("tcp://"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP address; write tcp://HOST:PORT, "
                                         f"e.g. tcp://127.0.0.1:5555")
    from edge.ipc.curve import is_loopback

    if not is_loopback(address):  # the runtime refuses it without CURVE keys, which bundles do not carry yet
        raise argparse.ArgumentTypeError(f"{text!r}: a bundle serves TCP on loopback only (tcp://127.0.0.1:PORT): "
                                         f"beyond it the runtime needs CURVE keys (edge serve --keys), which a "
                                         f"bundle cannot carry yet")
    return address
