"""``edge-bundle pack``: one signed, compressed file of a bundle directory (docs/archive.md).

Steps:

1. read the bundle's ``edge-bundle.json`` (its digest, engine, architecture, package identity)
   and check ``--engine``/``--arch`` against it: the archive describes the bundle, it does not
   change it;
2. walk the bundle (directories first, names sorted): regular files, directories and symlinks;
   anything else is refused, and so is a symlink whose target leaves the bundle (or, under
   ``rootfs/``, the rootfs) or a setuid/setgid mode; hash every file (the throughput is reported);
3. recompute the bundle's digest (image/bundle/digest.py) and refuse a bundle whose files no
   longer match the digest it was built with: the digest is in every reply's lineage;
4. write ``FILE.tmp``: the manifest, its signature, then each entry, as one pax tar stream
   through the compressor (compression.py), re-hashing each file as it is copied (a file
   changed since step 2 is refused); fsync, then rename it to ``FILE``.

``--engine``: the bundle runs one engine, and since ``edge-bundle build`` copies only that
engine's share of the model package (``image/bundle/package_copy.py``), it carries only that
engine's files: its libraries in the rootfs, and in ``/opt/edge/package`` the manifest
(unchanged), the tokenizer and the engine's ``files`` and ``gpu_files``. The runtime checks no
more at boot (``open_package(..., engine=E)``), and the bundle's digest covers what is there.
``--engine`` checks that the bundle runs that engine; leaving files out is the builder's job, not
the packer's (an archive describes the bundle, it does not change it). Before step 2 the packer
refuses a bundle whose package still holds a file only another engine reads (a bundle built
before the builder left them out): :func:`check_package_files`, one manifest read and one
directory listing (docs/archive.md, "Engines").
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from edge.update.archive import keys
from edge.update.archive.compression import DEFAULT_COMPRESSION, compressing_writer
from edge.update.archive.errors import PackError
from edge.update.archive.manifest import (BUNDLE_DIR, MANIFEST_MEMBER, SIGNATURE_MEMBER, Compatible, DirEntry, FileEntry,
                                    L4tRange, Manifest, PackageIdentity, SymlinkEntry, check_path, resolve_symlink)
from image.bundle.progress import Progress, human_bytes

__all__ = ["PackResult", "scan_bundle", "pack_bundle", "make_manifest", "write_archive", "bundle_metadata",
           "check_request", "check_package_files", "package_identity"]

METADATA_NAME = "edge-bundle.json"  # image.build_bundle.METADATA_NAME (not imported: it pulls in the builder)
_CHUNK = 1 << 20


@dataclass
class PackResult:
    path: Path
    archive_bytes: int  # compressed
    unpacked_bytes: int  # the files' sizes
    entries: int
    compression: str
    key_id: str
    hash_s: float  # step 2's hashing
    digest_s: float  # step 3
    write_s: float  # step 4: tar, compress, write
    manifest: Manifest


def bundle_metadata(bundle: Path) -> dict:
    """``edge-bundle.json`` of ``bundle``; PackError when it is not a bundle."""
    meta_path = Path(bundle) / METADATA_NAME
    if not meta_path.is_file() or not (Path(bundle) / "config.json").is_file():
        raise PackError(f"{bundle} is not a bundle (no config.json and {METADATA_NAME}); make one with "
                        f"`edge-bundle build --out DIR`")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as exc:
        raise PackError(f"{meta_path}: cannot read it ({exc})") from None
    missing = [k for k in ("bundle_sha256", "engine", "arch", "package") if k not in meta]
    if missing:
        raise PackError(f"{meta_path} has no {', '.join(missing)}: not as edge-bundle build writes it; rebuild "
                        f"the bundle")
    return meta


def check_request(bundle: Path, out: Path, *, engine: str | None = None, arch: str | None = None,
                  force: bool = False) -> dict:
    """The bundle's metadata, when the request makes sense for it; PackError saying what to change."""
    meta = bundle_metadata(bundle)
    if engine is not None and engine != meta["engine"]:
        raise PackError(f"--engine {engine}: the bundle runs {meta['engine']} (its rootfs holds that engine's "
                        f"libraries only); build a bundle with `edge-bundle build --engine {engine}`")
    if arch is not None and arch != meta["arch"]:
        raise PackError(f"--arch {arch}: the bundle's files are built for {meta['arch']}; build the bundle on "
                        f"(or for) {arch}")
    if out.is_dir():
        raise PackError(f"--out {out} is a directory; give the archive's file name (NAME.edgebundle)")
    if out.exists() and not force:
        raise PackError(f"--out {out} exists; pass --force to replace it")
    return meta


def check_package_files(bundle: Path, meta: dict) -> None:
    """PackError when the bundle's model package holds files only another engine reads than the
    one the bundle runs (``Manifest.files_of``): built before ``edge-bundle build`` left them out,
    they would ship (~40 MB of the compressed archive) for nothing. A rootfs without a package
    manifest is not judged here."""
    from edge.errors import PackageError
    from edge.preload.manifest import MANIFEST_NAME, open_package

    pkg_dir = Path(bundle) / "rootfs" / str(meta["package"].get("path") or "/opt/edge/package").lstrip("/")
    if not (pkg_dir / MANIFEST_NAME).is_file():
        return
    try:
        manifest = open_package(pkg_dir, verify="none").manifest  # the manifest and its own digest
    except PackageError as exc:
        raise PackError(f"{bundle}: its model package cannot be read ({exc}); rebuild the bundle") from None
    engine, source = meta["engine"], meta["package"].get("source")
    others = set(manifest.files) - set(manifest.files_of(engine))
    extra = sorted(p.name for p in pkg_dir.iterdir() if p.name in others)
    if extra:
        again = f" --package {source}" if source else ""
        raise PackError(f"{bundle}: its model package holds {', '.join(extra)}, which {engine} (the engine the "
                        f"bundle runs) never reads: the bundle was built before edge-bundle build left other "
                        f"engines' files out; rebuild it: `edge-bundle build --out {bundle} --engine {engine}"
                        f"{again} --force`")


def package_identity(meta: dict) -> PackageIdentity:
    return PackageIdentity(**{k: meta["package"].get(k) for k in ("name", "package_sha256", "model_sha256",
                                                                  "tokenizer_sha256")})


def _sha256(path: str, size: int) -> str:
    from edge.preload.manifest import sha256_file  # one mapped hash call (the GIL released)

    digest = sha256_file(path)
    if os.stat(path).st_size != size:
        raise PackError(f"{path} changed size while it was hashed; pack a bundle nothing writes to")
    return digest


def scan_bundle(bundle: Path, progress: Progress | None = None) -> tuple[list, dict[str, str], float]:
    """The manifest entries of ``bundle`` (parents first, names sorted), the host path of each,
    and the seconds spent hashing; PackError for what an archive cannot hold."""
    progress = progress or Progress(quiet=True)
    bundle = Path(bundle)
    entries: list = []
    host: dict[str, str] = {}
    files: list[tuple[str, os.stat_result]] = []

    def add(rel: str, path: str, st: os.stat_result) -> None:
        try:
            check_path(rel)
        except ValueError as exc:
            raise PackError(f"{path}: cannot be in an archive: {exc}") from None
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISLNK(st.st_mode):
            entries.append(("symlink", rel, os.readlink(path)))
        elif mode & 0o6000:
            raise PackError(f"{path}: mode {mode:o} has the setuid or setgid bit; a bundle needs neither")
        elif stat.S_ISDIR(st.st_mode):
            entries.append(("dir", rel, mode))
        elif stat.S_ISREG(st.st_mode):
            entries.append(("file", rel, st))
            files.append((rel, st))
        else:
            raise PackError(f"{path}: not a regular file, directory or symlink (a fifo, socket or device "
                            f"node); an archive holds none: remove it from the bundle")
        host[rel] = path

    def walk(rel: str, path: str) -> None:
        try:
            children = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError as exc:
            raise PackError(f"{path}: cannot list it ({exc.strerror or exc})") from None
        for child in children:
            st = child.stat(follow_symlinks=False)
            add(f"{rel}/{child.name}", child.path, st)
            if stat.S_ISDIR(st.st_mode):
                walk(f"{rel}/{child.name}", child.path)

    add(BUNDLE_DIR, str(bundle), os.stat(bundle))
    if entries[0][0] != "dir":
        raise PackError(f"{bundle} is not a directory")
    walk(BUNDLE_DIR, str(bundle))
    links = {rel: target for kind, rel, target in (e for e in entries if e[0] == "symlink")}
    for rel, target in links.items():
        try:
            resolve_symlink(rel, target, links)
        except ValueError as exc:
            raise PackError(f"{host[rel]}: {exc}; an archive holds no symlink out of the bundle") from None

    total = sum(st.st_size for _rel, st in files)
    hashes: dict[str, str] = {}
    t0 = time.monotonic()
    done = 0
    for i, (rel, st) in enumerate(files, 1):
        try:
            hashes[rel] = _sha256(host[rel], st.st_size)
        except OSError as exc:
            raise PackError(f"{host[rel]}: cannot read it ({exc.strerror or exc})") from None
        done += st.st_size
        progress.count("hashing", i, len(files), done)
    hash_s = time.monotonic() - t0
    progress.done(f"hashed {len(files)} files, {human_bytes(total)} in {hash_s:.2f} s "
                  f"({total / 1e6 / max(hash_s, 1e-9):.0f} MB/s)")

    out = []
    for kind, rel, value in entries:
        if kind == "file":
            out.append(FileEntry(path=rel, type="file", mode=stat.S_IMODE(value.st_mode), size=value.st_size,
                                 sha256=hashes[rel], mtime=int(value.st_mtime)))
        elif kind == "dir":
            out.append(DirEntry(path=rel, type="dir", mode=value))
        else:
            out.append(SymlinkEntry(path=rel, type="symlink", target=value))
    return out, host, hash_s


def _check_digest(bundle: Path, meta: dict) -> None:
    """The bundle's files still hash to the digest it was built with."""
    from image.bundle.digest import bundle_digest, config_digest_entry

    config = json.loads((bundle / "config.json").read_text())
    digest = bundle_digest(bundle / "rootfs", config)
    recorded = config_digest_entry(config)
    if digest != meta["bundle_sha256"] or (recorded is not None and recorded != digest):
        raise PackError(f"{bundle}: its files no longer hash to the digest it was built with "
                        f"({meta['bundle_sha256'][:16]}...): it was edited or damaged after the build; rebuild it "
                        f"(`edge-bundle verify {bundle}` lists missing files)")


def _tarinfo(name: str, kind: bytes, *, mode: int = 0o644, size: int = 0, mtime: int = 0, target: str = ""):
    ti = tarfile.TarInfo(name)
    ti.type, ti.mode, ti.size, ti.mtime, ti.linkname = kind, mode, size, mtime, target
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""  # owners are not kept: the installer sets them
    return ti


class _HashingSource:
    """A file as tarfile copies it, hashed on the way (it must still be what was scanned)."""

    def __init__(self, f, progress_cb) -> None:
        self._f, self._cb = f, progress_cb
        self.hash = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self.hash.update(data)
        self._cb(len(data))
        return data


def pack_bundle(bundle: Path, key_path: Path, out: Path, *, engine: str | None = None, arch: str | None = None,
                l4t_min: str | None = None, l4t_max: str | None = None, devices: list[str] | None = None,
                compression: str = DEFAULT_COMPRESSION, level: int | None = None, force: bool = False,
                progress: Progress | None = None) -> PackResult:
    """Write the signed archive of ``bundle`` to ``out`` (see the module docstring)."""
    progress = progress or Progress(quiet=True)
    bundle, out = Path(bundle).resolve(), Path(out)
    meta = check_request(bundle, out, engine=engine, arch=arch, force=force)
    check_package_files(bundle, meta)
    private = keys.load_private(key_path)
    kid = keys.key_id(private.public_key())
    try:
        l4t = None if l4t_min is None and l4t_max is None else L4tRange(min=l4t_min, max=l4t_max)
        compatible = Compatible(arch=meta["arch"], devices=list(devices or []), l4t=l4t)
        package = package_identity(meta)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise PackError(f"the compatibility or the package identity is not valid: {exc}") from None

    entries, host, hash_s = scan_bundle(bundle, progress)
    t0 = time.monotonic()
    progress.spin("checking the bundle digest")
    _check_digest(bundle, meta)
    digest_s = time.monotonic() - t0
    manifest = make_manifest(meta, entries, kid, compatible, package)

    write_s = write_archive(out, manifest, keys.sign(private, manifest.to_json()), host, compression=compression,
                            level=level, progress=progress)
    size = out.stat().st_size
    total = manifest.unpacked_bytes
    progress.done(f"packed {out}: {human_bytes(size)} ({size / max(total, 1):.1%} of {human_bytes(total)}), "
                  f"{len(manifest.files)} entries, {compression}, {write_s:.1f} s, key {kid}")
    return PackResult(path=out, archive_bytes=size, unpacked_bytes=total, entries=len(manifest.files),
                      compression=compression, key_id=kid, hash_s=hash_s, digest_s=digest_s, write_s=write_s,
                      manifest=manifest)


def make_manifest(meta: dict, entries: list, kid: str, compatible: Compatible,
                  package: PackageIdentity) -> Manifest:
    """The manifest of a bundle (its ``edge-bundle.json`` is ``meta``) with these entries, now."""
    from edge import __version__

    try:
        return Manifest(format=1, created=datetime.now(timezone.utc).replace(microsecond=0),
                        edge_version=__version__, key_id=kid, bundle_sha256=meta["bundle_sha256"],
                        engine=meta["engine"], package=package, compatible=compatible,
                        unpacked_bytes=sum(e.size for e in entries if e.type == "file"), files=entries)
    except ValueError as exc:  # pydantic's ValidationError
        raise PackError(f"the manifest is not valid: {exc}") from None


def write_archive(out: Path, manifest: Manifest, signature: bytes, host: dict[str, str], *,
                  compression: str = DEFAULT_COMPRESSION, level: int | None = None,
                  progress: Progress | None = None) -> float:
    """Step 4: ``out.tmp``, then renamed to ``out``; the seconds it took. ``host`` maps each file
    entry's path to the file to copy (each is re-hashed against its entry as it is copied)."""
    progress = progress or Progress(quiet=True)
    manifest_bytes = manifest.to_json()
    t0 = time.monotonic()
    tmp = out.with_name(out.name + ".tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    total = manifest.unpacked_bytes
    written = [0]

    def advanced(n: int) -> None:
        written[0] += n
        progress.spin(f"packing ({compression}): {human_bytes(written[0])} of {human_bytes(total)}")

    try:
        with open(tmp, "wb") as raw:
            sink = compressing_writer(raw, compression, level=level)
            stamp = int(manifest.created.timestamp())
            with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT, bufsize=_CHUNK) as tar:
                tar.addfile(_tarinfo(MANIFEST_MEMBER, tarfile.REGTYPE, size=len(manifest_bytes), mtime=stamp),
                            io.BytesIO(manifest_bytes))
                tar.addfile(_tarinfo(SIGNATURE_MEMBER, tarfile.REGTYPE, size=len(signature), mtime=stamp),
                            io.BytesIO(signature))
                for e in manifest.files:
                    if e.type == "dir":
                        tar.addfile(_tarinfo(e.path, tarfile.DIRTYPE, mode=e.mode))
                    elif e.type == "symlink":
                        tar.addfile(_tarinfo(e.path, tarfile.SYMTYPE, mode=0o777, target=e.target))
                    else:
                        _add_file(tar, e, host[e.path], advanced)
            sink.close()
            raw.flush()
            os.fsync(raw.fileno())
        os.rename(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return time.monotonic() - t0


def _add_file(tar: tarfile.TarFile, e: FileEntry, path: str, advanced) -> None:
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size != e.size:
                raise PackError(f"{path} changed size since it was hashed; pack a bundle nothing writes to")
            source = _HashingSource(f, advanced)
            tar.addfile(_tarinfo(e.path, tarfile.REGTYPE, mode=e.mode, size=e.size, mtime=e.mtime), source)
    except OSError as exc:
        raise PackError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if source.hash.hexdigest() != e.sha256:
        raise PackError(f"{path} changed since it was hashed; pack a bundle nothing writes to")
