"""The runtime a bundle runs: a wheel of ``edge/`` built from the commit, not from the working tree.

A reply's lineage names ``edge_commit``; for that to be true the code in the bundle must be
exactly that commit's. So the bundle builder never copies the checkout: it reads the shipped
files (``edge/`` and ``pyproject.toml``, which holds the dependencies) from ``git archive HEAD``,
writes them as a wheel with its own ``edge/_build_info.json`` (edge/system/version.py reads the commit
there), and installs that wheel into the rootfs's fixed prefix (image/bundle/layout.py).

* A tree whose shipped files differ from HEAD (edited, added, deleted) is refused, naming the
  files, unless ``allow_dirty``: then the wheel is built from the working tree, its commit is
  ``<sha>-dirty`` and ``dirty_sha256`` is a digest of the differing files' contents, so two
  different dirty trees never pass for one another.
* The wheel is deterministic: entries in path order, fixed timestamps (1980-01-01, the zip
  format's earliest), fixed modes, no host path. The same commit gives the same bytes from any
  checkout, in any directory.

Written here rather than by the build backend: setuptools's wheel (``pip wheel .``; it carries
``edge`` alone too, build_backend.py) is built from the working tree and stamps its own build
times; a wheel is a zip with three metadata files (PEP 427), which is all this needs.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import tarfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DeviceWheel", "DirtyTree", "build_device_wheel", "install_wheel", "SHIPPED", "read_wheel"]

SHIPPED = ("edge", "pyproject.toml")  # what the wheel is built from: its files must equal HEAD's
_SUFFIXES = (".py", ".fbs", ".json", ".typed")  # the package's sources and data (pyproject's package-data)
_DATE = (1980, 1, 1, 0, 0, 0)
BUILD_INFO = "edge/_build_info.json"


class DirtyTree(RuntimeError):
    """The shipped files differ from the commit; the message names them."""


@dataclass(frozen=True)
class DeviceWheel:
    path: Path
    commit: str  # the commit it was built from, "-dirty" appended when built from a changed tree
    dirty_sha256: str | None  # digest of the changed files' contents (None: clean)
    sha256: str  # of the wheel file

    def as_dict(self) -> dict:
        return {"file": self.path.name, "sha256": self.sha256, "commit": self.commit, "dirty_sha256": self.dirty_sha256}


def _git(repo: Path, *args: str, text: bool = True):
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=text)
    if r.returncode != 0:
        err = r.stderr if text else r.stderr.decode(errors="replace")
        raise DirtyTree(f"git {' '.join(args[:2])} in {repo} failed: {err.strip()[:300]}; the bundle's runtime is "
                        f"built from a git checkout's commit")
    return r.stdout


def _shipped(path: str) -> bool:
    return path == "pyproject.toml" or (path.startswith("edge/") and path.endswith(_SUFFIXES)
                                        and "__pycache__" not in path and path != BUILD_INFO)


def changed_files(repo: Path) -> list[str]:
    """Shipped files that differ from HEAD: modified, added (untracked, not ignored) or deleted."""
    out = _git(repo, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--", *SHIPPED)
    names = set()
    entries = out.split("\0")
    i = 0
    while i < len(entries):
        entry = entries[i]
        i += 1
        if len(entry) < 4:
            continue
        status, name = entry[:2], entry[3:]
        if status[0] in "RC":  # a rename: the next entry is its source
            names.add(entries[i])
            i += 1
        names.add(name)
    return sorted(n for n in names if _shipped(n))


def _head_files(repo: Path) -> dict[str, bytes]:
    data = _git(repo, "archive", "--format=tar", "HEAD", "--", *SHIPPED, text=False)
    files = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar:
            if member.isfile() and _shipped(member.name):
                files[member.name] = tar.extractfile(member).read()
    return files


def _tree_files(repo: Path) -> dict[str, bytes]:
    listed = _git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *SHIPPED)
    files = {}
    for name in listed.split("\0"):
        if name and _shipped(name) and os.path.isfile(repo / name):
            files[name] = (repo / name).read_bytes()
    return files


def _digest(files: dict[str, bytes], names: list[str]) -> str:
    h = hashlib.sha256()
    for name in names:
        content = files.get(name)
        h.update(f"{name}\0{'-' if content is None else hashlib.sha256(content).hexdigest()}\n".encode())
    return h.hexdigest()


def _metadata(pyproject: bytes) -> tuple[str, str, str]:
    """(name, version, METADATA text) from the shipped pyproject.toml."""
    project = tomllib.loads(pyproject.decode())["project"]
    lines = ["Metadata-Version: 2.1", f"Name: {project['name']}", f"Version: {project['version']}",
             f"Summary: {project.get('description', '')}"]
    if "requires-python" in project:
        lines.append(f"Requires-Python: {project['requires-python']}")
    lines += [f"Requires-Dist: {d}" for d in project.get("dependencies", [])]
    return project["name"], project["version"], "\n".join(lines) + "\n"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _write_wheel(out_dir: Path, files: dict[str, bytes], build_info: dict) -> Path:
    name, version, metadata = _metadata(files["pyproject.toml"])
    dist = f"{name}-{version}.dist-info"
    entries = {k: v for k, v in files.items() if k.startswith("edge/")}
    entries[BUILD_INFO] = (json.dumps(build_info, sort_keys=True) + "\n").encode()
    entries[f"{dist}/METADATA"] = metadata.encode()
    entries[f"{dist}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: edge-bundle\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [_record_line(n, d) for n, d in sorted(entries.items())] + [f"{dist}/RECORD,,"]
    entries[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = out_dir / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for n in sorted(entries):
            info = zipfile.ZipInfo(n, date_time=_DATE)
            info.external_attr = 0o100644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, entries[n], compresslevel=9)
    return path


def build_device_wheel(repo: Path, out_dir: Path, *, allow_dirty: bool = False) -> DeviceWheel:
    """The wheel of ``edge/`` at HEAD of ``repo`` (the working tree's, with ``allow_dirty``), in ``out_dir``."""
    repo = Path(_git(repo, "rev-parse", "--show-toplevel").strip())
    sha = _git(repo, "rev-parse", "HEAD").strip()
    changed = changed_files(repo)
    if changed and not allow_dirty:
        shown = ", ".join(changed[:8]) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")
        raise DirtyTree(f"the runtime's files differ from commit {sha[:12]}: {shown}. A bundle runs a commit's "
                        f"code and its lineage names that commit: commit them, or pass --allow-dirty (the lineage "
                        f"then says {sha[:12]}...-dirty)")
    files = _tree_files(repo) if changed else _head_files(repo)
    dirty = _digest(files, changed) if changed else None
    commit = f"{sha}-dirty" if changed else sha
    out_dir.mkdir(parents=True, exist_ok=True)
    path = _write_wheel(out_dir, files, {"commit": commit, "dirty_sha256": dirty})
    return DeviceWheel(path, commit, dirty, hashlib.sha256(path.read_bytes()).hexdigest())


def read_wheel(path: Path) -> DeviceWheel:
    """A wheel :func:`build_device_wheel` wrote (e.g. on the host, for a build in an emulated root)."""
    with zipfile.ZipFile(path) as zf:
        info = json.loads(zf.read(BUILD_INFO))
    return DeviceWheel(Path(path), info["commit"], info.get("dirty_sha256"),
                       hashlib.sha256(Path(path).read_bytes()).hexdigest())


def install_wheel(wheel: Path, target: Path) -> Path:
    """Install the pure wheel into ``target`` (a site directory): its files, and an INSTALLER.

    Installing a pure wheel is unpacking it (PEP 427); pip would add a ``direct_url.json``
    naming the wheel's path on this host, which the bundle must not carry."""
    target.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.startswith("/") or ".." in name.split("/"):
                raise DirtyTree(f"{wheel}: entry {name!r} escapes the target")
            dest = target / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(zf.read(name))
            os.chmod(dest, 0o644)
        dist = next(n.split("/")[0] for n in zf.namelist() if n.endswith(".dist-info/WHEEL"))
    (target / dist / "INSTALLER").write_text("edge-bundle\n")
    return target
