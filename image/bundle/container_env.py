"""The container's environment (``process.env`` of config.json), which the traced boot on the
build host also runs under: the same interpreter view, thread pools and allocator as on the device."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from edge.launch import boot_pythonpath_of

__all__ = ["JEMALLOC_CONF", "container_env", "jemalloc_of"]

JEMALLOC_CONF = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0"  # return memory within ~1 s


def jemalloc_of(python: str) -> str | None:
    """The host's (or the environment's) libjemalloc, when there is one."""
    machine = platform.machine()
    candidates = [Path(python).resolve().parent.parent / "lib" / "libjemalloc.so.2",
                  Path(f"/usr/lib/{machine}-linux-gnu/libjemalloc.so.2"), Path("/usr/local/lib/libjemalloc.so.2")]
    return next((str(p) for p in candidates if p.exists()), None)


def container_env(python: str, threads: int | None, device: str, jemalloc: str | None) -> dict[str, str]:
    env = {
        "PATH": f"{Path(python).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",  # tmpfs: ONNX Runtime creates and locks $HOME/.cache/.../onnxruntime.db
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",  # read-only root; the .pyc files are in the bundle
        "PYTHONUNBUFFERED": "1",  # one JSON log line per event, straight to the journal
        "OPENBLAS_NUM_THREADS": "1",  # numpy does no heavy math here; no idle BLAS pool
        "MKL_NUM_THREADS": "1",
        "EDGE_DEVICE": device,
        # The runtime starts with ``python -S`` (edge/launch.py): the module path site would build.
        "PYTHONPATH": os.pathsep.join(boot_pythonpath_of(python)),
    }
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)  # torch's intra-op pool; ORT sizes its own per core
    if jemalloc:
        env["LD_PRELOAD"] = jemalloc
        env["MALLOC_CONF"] = JEMALLOC_CONF
    return env
