"""The command line that starts the runtime: ``python -S -m edge.boot`` and its module path.

``-S`` skips ``site``: no ``.pth`` files are read, so nothing they import runs at boot. In a
development install that is an editable-install finder which alone imports pathlib,
urllib and fnmatch; ``site`` costs 35-40 ms of this machine's 50 ms interpreter start
(measured: ``python -c pass`` 50-60 ms, ``python -S -c pass`` 14-20 ms). The module
path ``site`` would have built is given explicitly instead, in ``PYTHONPATH``: the
environment's site-packages and the directory that holds ``edge``.

The bundle's ``config.json`` (``image/build_bundle.py``), its tracer and the cold-start
benchmark all start the runtime with this, so the benchmark measures the command the
device runs. Standard library only; nothing here runs at boot.
"""

from __future__ import annotations

import os
import sys
import sysconfig

__all__ = ["boot_argv", "boot_pythonpath", "boot_pythonpath_of", "boot_env", "compile_bytecode"]


def boot_argv(python: str | None = None) -> list[str]:
    """``[python, "-S", "-m", "edge.boot"]``: append the runtime's own arguments."""
    return [python or sys.executable, "-S", "-m", "edge.boot"]


def boot_pythonpath() -> list[str]:
    """Directories the runtime imports from without ``site``: edge's root, then site-packages."""
    import edge

    paths = [os.path.dirname(os.path.dirname(os.path.abspath(edge.__file__)))]
    for key in ("purelib", "platlib"):
        path = sysconfig.get_path(key)
        if path and path not in paths:
            paths.append(path)
    return paths


def boot_pythonpath_of(python: str) -> list[str]:
    """:func:`boot_pythonpath` as interpreter ``python`` (another environment) sees it."""
    import subprocess

    if os.path.realpath(python) == os.path.realpath(sys.executable) and sys.prefix == _prefix_of(python):
        return boot_pythonpath()
    code = "import os; from edge.runtime.launch import boot_pythonpath; print(os.pathsep.join(boot_pythonpath()))"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    return [p for p in out.split(os.pathsep) if p]


def _prefix_of(python: str) -> str:
    # A venv's python is a symlink to the base interpreter; the venv is its parent's parent.
    return os.path.dirname(os.path.dirname(os.path.abspath(python)))


def boot_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with ``PYTHONPATH`` set for :func:`boot_argv`.

    A ``PYTHONPATH`` already there is kept, after ours: ``-S`` drops only what site adds.
    """
    out = dict(os.environ if env is None else env)
    ours = boot_pythonpath()
    extra = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p and p not in ours]
    out["PYTHONPATH"] = os.pathsep.join([*ours, *extra])
    return out


def compile_bytecode() -> int:
    """Write the ``.pyc`` files of the ``edge`` package; returns how many modules it holds.

    A bundle ships its byte code compiled (``image/bundle/rootfs.py``). A process started
    from a source checkout has it only if an earlier run could write it, and never under
    ``PYTHONDONTWRITEBYTECODE`` (set in this project's CI and sandbox): each start then
    compiles the runtime's modules from source, about 70 ms of boot here. The benchmarks
    call this before timing a plain process; up-to-date files are left as they are.
    """
    import compileall
    from pathlib import Path

    import edge

    root = Path(edge.__file__).resolve().parent
    if not compileall.compile_dir(str(root), quiet=1, workers=1):
        raise RuntimeError(f"byte-compiling {root} failed (a syntax error in the runtime?)")
    return sum(1 for _ in root.rglob("*.py"))
