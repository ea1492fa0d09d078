"""Helpers of the installer's tests (fixtures are in conftest.py)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

__all__ = ["REPO_ROOT", "tree_digest", "run_cli"]

REPO_ROOT = Path(__file__).resolve().parents[2]


def tree_digest(top: Path, skip: tuple[str, ...] = ()) -> str:
    """Every path under ``top`` with its type, mode, owner and content (file bytes, link target);
    not times: a refused install must leave this equal. ``skip``: names right under ``top`` left out."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(top):
        if Path(dirpath) == Path(top):
            dirnames[:] = [d for d in dirnames if d not in skip]
            filenames = [f for f in filenames if f not in skip]
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            st = os.lstat(p)
            h.update(f"{p.relative_to(top)}\0{st.st_mode:o}\0{st.st_uid}:{st.st_gid}\0".encode())
            if stat.S_ISREG(st.st_mode):
                h.update(hashlib.sha256(p.read_bytes()).digest())
            elif stat.S_ISLNK(st.st_mode):
                h.update(os.readlink(p).encode())
    return h.hexdigest()


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``edge-bundle ARGV`` in this process: (exit status, stdout, stderr)."""
    from image.build_bundle import main

    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err
