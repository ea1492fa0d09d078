"""The default model package of a build host: where it lives and how ``edge serve`` builds it.

A build-host step of ``edge serve``, run before the runtime boots, never a boot stage: a
device's bundle ships its package, and the runtime (``edge/boot.py``) only ever opens one.
The build runs the build-host tool (``python -m image.package build``) as a subprocess, so the
runtime never imports ``image/``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from edge.errors import BootError

__all__ = ["DEFAULT_PACKAGE_NAME", "default_package_dir", "ensure_default_package"]

DEFAULT_PACKAGE_NAME = "all-MiniLM-L6-v2"


def default_package_dir() -> Path:
    """Where the default model package lives (built there on first use of ``edge serve``)."""
    from edge import __version__

    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "edge" / "packages" / f"{DEFAULT_PACKAGE_NAME}-edge{__version__}"


def ensure_default_package(path: Path) -> Path:
    """Build the default package at ``path`` with the build-host tool if it is not there.

    The builder writes beside ``path`` and renames into place, so an interrupted build never
    leaves a half package behind.
    """
    if (path / "manifest.json").exists():
        return path
    import subprocess  # only here: a device never builds

    from edge.log import log

    log("package.build", out=str(path), reason="default package not built yet")
    cmd = [sys.executable, "-m", "image.package", "build", "--out", str(path)]
    result = subprocess.run(cmd, stdout=sys.stderr)
    if result.returncode != 0:
        raise BootError(
            f"building the default package failed (exit {result.returncode}): {' '.join(cmd)}",
            stage="ensure_default_package",
            setting="--package DIR (a package built with `edge-package build --out DIR`)",
        )
    return path
