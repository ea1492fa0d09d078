"""Where the runtime lives inside a bundle: fixed paths, whatever the build host's layout.

The traced boot runs on the build host, from its interpreter (a distribution's, a pyenv install
in the build user's home, a virtual environment anywhere, /tmp included) and from the device
wheel installed in a work directory (image/bundle/wheel.py). The rootfs holds the same files at
fixed paths, so that two build hosts with the same commit and the same dependency versions
write the same bundle, and no bundle names a build host's directories:

=======================================  =========================================
build host                               rootfs
=======================================  =========================================
the interpreter (its real file)          ``/opt/edge/python/bin/pythonX.Y``
the standard library                     ``/opt/edge/python/lib/pythonX.Y``
libpython, under the interpreter's       ``/opt/edge/python/lib/``
prefix
the rest of a prefix of its own (pyenv)  ``/opt/edge/python/``
the device wheel's install and the       ``/opt/edge/lib`` (one site directory)
environment's site-packages
anything else (system libraries)         the same path
=======================================  =========================================

The container starts the interpreter with ``PYTHONHOME=/opt/edge/python`` and
``PYTHONPATH=/opt/edge/lib`` (image/bundle/container_env.py); ``/usr/bin/python3`` and
``/usr/bin/python`` link to it, for the commands of deploy/ and for ``runc exec``.

An interpreter records its configure prefix in its binaries (RUNPATH, the compiled-in
prefix) and its ``_sysconfigdata`` module. :func:`rewrite_host_paths` rewrites those in the
copies: text files by replacement, binaries in place with the length kept
(:func:`_rewrite_binary`; a new path longer than the old one is left, and reported by the build).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

__all__ = ["PREFIX", "PYTHON_HOME", "SITE", "Layout", "rewrite_host_paths", "python_links"]

PREFIX = "/opt/edge"
PYTHON_HOME = f"{PREFIX}/python"
SITE = f"{PREFIX}/lib"
SYSTEM_PREFIXES = ("/", "/usr", "/usr/local")  # a distribution's interpreter: only its own files move


def _real(path: str) -> str:
    return os.path.realpath(path)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@dataclass
class Layout:
    """The map from the traced boot's host paths to the rootfs's.

    ``executable``: the traced interpreter; ``base_prefix``: its prefix; ``version``: (major,
    minor); ``site_dirs``: the directories the traced boot imported from (the wheel's install
    first, then the environment's site-packages)."""

    executable: str
    base_prefix: str
    version: tuple[int, int]
    site_dirs: list[str]
    roots: list[tuple[str, str]] = field(init=False)  # (host root, rootfs root), most specific first

    def __post_init__(self) -> None:
        major, minor = self.version[:2]
        base = _real(self.base_prefix)
        stdlib = _real(os.path.join(self.base_prefix, "lib", f"python{major}.{minor}"))
        roots = [(_real(d), SITE) for d in self.site_dirs]
        roots.append((stdlib, f"{PYTHON_HOME}/lib/python{major}.{minor}"))
        if base not in SYSTEM_PREFIXES:
            roots.append((base, PYTHON_HOME))
        self.roots = sorted(roots, key=lambda r: -len(r[0]))
        self.python = f"{PYTHON_HOME}/bin/python{major}.{minor}"
        self._exe = _real(self.executable)
        self._base = base

    def container_path(self, host: str) -> str:
        """Where host file ``host`` goes in the rootfs (absolute, container view)."""
        real = _real(host)
        if real == self._exe:
            return self.python
        name = os.path.basename(real)
        if name.startswith("libpython") and _under(real, self._base):
            return f"{PYTHON_HOME}/lib/{name}"
        for root, dest in self.roots:
            if _under(real, root):
                return dest + real[len(root):]
        return os.path.normpath(host)

    def relocated(self, host: str) -> bool:
        return self.container_path(host) != os.path.normpath(host)

    def replacements(self) -> list[tuple[bytes, bytes]]:
        """(host path, rootfs path) pairs to rewrite in copied files, longest host path first."""
        pairs = {root: dest for root, dest in self.roots}
        pairs[self._base] = PYTHON_HOME  # a compiled-in prefix names the prefix, even a system one's stdlib
        for raw in {self.base_prefix, *self.site_dirs}:  # the unresolved spellings too
            if raw not in pairs and _real(raw) in pairs:
                pairs[raw] = pairs[_real(raw)]
        return sorted(((k.encode(), v.encode()) for k, v in pairs.items() if k not in SYSTEM_PREFIXES),
                      key=lambda kv: -len(kv[0]))


def _rewrite_binary(data: bytes, old: bytes, new: bytes) -> tuple[bytes, int]:
    """``old`` -> ``new`` in a binary, in place: each occurrence becomes ``new``, then as many
    ``/`` as keep the length (``/opt/edge/python/////lib`` is ``/opt/edge/python/lib``), so no
    byte after it moves. Where ``old`` ends its C string, its last component is kept at the end
    (``.../python//3.11.7``): a linker merges string constants by their tails, and ``PY_VERSION``
    ("3.11.7") may be the tail of a pyenv prefix. An occurrence without room is left as it is."""
    out, i, n = bytearray(data), 0, 0
    while (i := out.find(old, i)) >= 0:
        j = i + len(old)
        keep = old.rsplit(b"/", 1)[-1] if j >= len(out) or out[j] == 0 else b""
        pad = len(old) - len(new) - len(keep)
        if pad >= (1 if keep else 0):
            out[i:j] = new + b"/" * pad + keep
            n += 1
        i = j
    return bytes(out), n


def rewrite_host_paths(path: str, pairs: list[tuple[bytes, bytes]]) -> int:
    """Rewrite the host paths of ``pairs`` in the file at ``path`` (a copy in the rootfs); returns
    how many occurrences were rewritten. Binary replacements longer than the old path are skipped."""
    with open(path, "rb") as f:
        data = f.read()
    if not any(old in data for old, _ in pairs):
        return 0
    binary = b"\0" in data
    count = 0
    for old, new in pairs:
        if old not in data:
            continue
        if binary:
            data, n = _rewrite_binary(data, old, new)
        else:
            n = data.count(old)
            data = data.replace(old, new)
        count += n
    mode = os.stat(path).st_mode
    os.chmod(path, mode | 0o200)
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)
    return count


def python_links(python: str) -> dict[str, str]:
    """Symlinks to the rootfs's interpreter: link path -> target."""
    name = os.path.basename(python)
    major = name.split(".")[0]  # python3
    return {f"{PYTHON_HOME}/bin/{major}": name, f"{PYTHON_HOME}/bin/python": name,
            f"/usr/bin/{major}": python, "/usr/bin/python": python}


def host_private_roots(extra: list[str] = ()) -> list[str]:
    """Directories of the build host a bundle must never name: the checkout, the environment,
    the home directory, and the ones given (work directories)."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    roots = {repo, sys.prefix, os.path.expanduser("~"), *extra}
    return sorted(r for r in roots if r and r not in ("/", "") and len(r) > 1)
