"""The container's environment (``process.env`` of config.json), and the one the traced boot
runs under on the build host: the same thread pools, allocator and interpreter flags; only
where the interpreter and the modules are differs (image/bundle/layout.py)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from image.bundle.layout import PYTHON_HOME, SITE, Layout

__all__ = ["JEMALLOC_CONF", "container_env", "trace_env", "jemalloc_of"]

JEMALLOC_CONF = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0"  # return memory within ~1 s


def jemalloc_of(python: str) -> str | None:
    """The host's (or the environment's) libjemalloc, when there is one."""
    machine = platform.machine()
    candidates = [Path(python).resolve().parent.parent / "lib" / "libjemalloc.so.2",
                  Path(f"/usr/lib/{machine}-linux-gnu/libjemalloc.so.2"), Path("/usr/local/lib/libjemalloc.so.2")]
    return next((str(p) for p in candidates if p.exists()), None)


def _common(threads: int | None, device: str) -> dict[str, str]:
    env = {
        "HOME": "/tmp",  # tmpfs: whatever a library writes under $HOME goes there, the root stays read-only
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",  # read-only root; the .pyc files are in the bundle
        "PYTHONUNBUFFERED": "1",  # one JSON log line per event, straight to the journal
        "OPENBLAS_NUM_THREADS": "1",  # numpy does no heavy math here; no idle BLAS pool
        "MKL_NUM_THREADS": "1",
        "EDGE_DEVICE": device,
    }
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)  # torch's intra-op pool; ORT sizes its own per core
    return env


def _allocator(env: dict[str, str], jemalloc: str | None) -> dict[str, str]:
    if jemalloc:
        env["LD_PRELOAD"] = jemalloc
        env["MALLOC_CONF"] = JEMALLOC_CONF
    return env


def container_env(layout: Layout, threads: int | None, device: str, jemalloc: str | None) -> dict[str, str]:
    """The container's: the interpreter at ``PYTHON_HOME`` (its prefix named, not searched for:
    no ``pyvenv.cfg`` and no build-host prefix), the modules in ``SITE``. The runtime starts
    with ``python -S`` (edge/runtime/launch.py), so ``PYTHONPATH`` is the whole module path."""
    env = {"PATH": f"{PYTHON_HOME}/bin:/usr/local/bin:/usr/bin:/bin", **_common(threads, device),
           "PYTHONHOME": PYTHON_HOME, "PYTHONPATH": SITE,
           # libpython, for an interpreter linked to it (pyenv's RUNPATH named the build host's prefix)
           "LD_LIBRARY_PATH": f"{PYTHON_HOME}/lib"}
    return _allocator(env, layout.container_path(jemalloc) if jemalloc else None)


def trace_env(python: str, site_dirs: list[str], threads: int | None, device: str,
              jemalloc: str | None) -> dict[str, str]:
    """The traced boot's, on the build host: the environment's interpreter, the device wheel's
    install first on the module path, then the environment's site-packages."""
    env = {"PATH": f"{Path(python).parent}:/usr/local/bin:/usr/bin:/bin", **_common(threads, device),
           "PYTHONPATH": os.pathsep.join(site_dirs)}
    return _allocator(env, jemalloc)
