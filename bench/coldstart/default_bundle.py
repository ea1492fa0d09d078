"""The bundle ``edge-coldstart --snapshot`` measures when no ``--bundle`` is given: one of the
model package for the engine, built once with ``edge-bundle build`` and kept.

It lives under :data:`ROOT`, keyed by what decides its contents (the package's manifest, the
engine, the interpreter, the source of ``edge/`` and of the bundle builder), so a changed
checkout builds a fresh bundle instead of measuring a stale one. The older bundles of the same
engine go, with the snapshots beside them (a bundle is about 400 MB).

Not under ``~/.cache``: a restore runs in the container's user namespace, as an unprivileged
host uid, and root's home is 0700 (every directory above the rootfs must let others search
it; docs/snapshot.md). The socket directory is :data:`SOCKET_DIR`, not the service's
``/run/edge``, so the benchmark never answers for (or collides with) an installed service; it is
prepared like any bundle's (``runtime_runs.prepare_socket_dir``, edge/system/socket_dir.py), a 0750
directory being no obstacle to a snapshot (only the directories above it must be searchable).
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import sys
from pathlib import Path

__all__ = ["ROOT", "SOCKET_DIR", "bundle_key", "default_bundle"]

ROOT = Path("/var/cache/edge/coldstart")
SOCKET_DIR = "/run/edge-coldstart"
REPO = Path(__file__).resolve().parents[2]
# What ends up in the bundle. image/bundle/snapshot.py only takes and restores snapshots.
_SOURCES = ("edge/**/*.py", "image/build_bundle.py", "image/bundle/*.py")
_NOT_IN_THE_BUNDLE = frozenset({"image/bundle/snapshot.py"})


def bundle_key(package: Path, engine: str) -> str:
    h = hashlib.sha256(f"{engine};{sys.executable};{sys.version}\n".encode())
    h.update((package / "manifest.json").read_bytes())
    for pattern in _SOURCES:
        for p in sorted(REPO.glob(pattern)):
            rel = p.relative_to(REPO).as_posix()
            if rel not in _NOT_IN_THE_BUNDLE:
                h.update(rel.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def default_bundle(package: Path, engine: str, say=lambda msg: None, quiet: bool = False) -> Path:
    """``ROOT/<engine>-<key>/bundle``, built first when it is not there (a minute or more)."""
    from image.build_bundle import build_bundle
    from image.bundle.progress import Progress

    key = bundle_key(package, engine)
    home = ROOT / f"{engine}-{key}"
    out = home / "bundle"
    ROOT.mkdir(parents=True, exist_ok=True)
    for d in (ROOT.parent, ROOT):
        d.chmod(0o755)  # searchable by the restore's unprivileged uid
    with open(ROOT / f"{engine}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another edge-coldstart builds the same bundle first
        if not (out / "edge-bundle.json").is_file():
            say(f"bundle: building {out} from {package} ({engine}; once per checkout, a minute or more)...")
            home.mkdir(parents=True, exist_ok=True)
            home.chmod(0o755)
            # allow_dirty: the benchmark measures the tree it runs from; the lineage says so (-dirty)
            build_bundle(out, package=package, engine=engine, socket_dir=SOCKET_DIR, force=True,
                         progress=Progress(quiet=quiet), allow_dirty=True)
        for other in ROOT.glob(f"{engine}-*"):
            if other != home and other.is_dir():
                shutil.rmtree(other, ignore_errors=True)
    return out

