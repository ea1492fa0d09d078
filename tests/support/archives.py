"""Archives for the installer's tests: a small fake bundle packed by the real packer
(image/archive/pack.py), and a crafted packer that follows docs/archive.md by hand to make
archives that are wrong in one chosen way (the real packer refuses to make them).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Callable

from edge.update.archive import keys
from edge.update.archive.compression import compressing_writer
from edge.update.archive.manifest import MANIFEST_MEMBER, SIGNATURE_MEMBER, parse_manifest
from image.archive.pack import make_manifest, pack_bundle, package_identity, scan_bundle
from edge.update.archive.verify import ArchiveReader
from image.bundle.digest import bundle_digest

__all__ = ["keygen", "fake_bundle", "pack", "pack_crafted", "manifest_of_archive"]


def keygen(out: Path) -> tuple[Path, Path]:
    private, public, _ = keys.keygen(out)
    return private, public


def fake_bundle(out: Path, version: int = 1, big: int = (3 << 20) // 2, arch: str = "x86_64",
                package: Callable[[Path], object] | None = None) -> Path:
    """A bundle-shaped directory the packer accepts (its digest is right): config.json,
    edge-bundle.json, a rootfs with an executable, a ``big``-byte file (several read chunks), an
    empty file, a relative and an absolute symlink, a sticky directory, the unit's drop-in.
    ``package``: called with the package directory to write more into it (a manifest)."""
    rootfs = out / "rootfs"
    for d in ("usr/bin", "usr/lib64", "etc", "opt/edge/package", "tmp"):
        (rootfs / d).mkdir(parents=True, exist_ok=True)
    tool = rootfs / "usr/bin/python3"
    tool.write_bytes(b"#!/bin/sh\necho fake %d\n" % version)
    os.chmod(tool, 0o755)
    (rootfs / "usr/lib64/libfake.so").write_bytes(os.urandom(4096))
    (rootfs / "opt/edge/package/model.onnx").write_bytes(hashlib.sha256(b"%d" % version).digest() * (big // 32))
    if package is not None:
        package(rootfs / "opt/edge/package")
    (rootfs / "etc/empty").write_bytes(b"")
    os.symlink("usr/lib64", rootfs / "lib64")
    os.symlink("/usr/share/zoneinfo/UTC", rootfs / "etc/localtime")
    os.chmod(rootfs / "tmp", 0o1777)
    (out / "edge.service.d").mkdir()
    (out / "edge.service.d/limits.conf").write_text("[Service]\nMemoryMax=2G\n")
    config = {"ociVersion": "1.0.2", "process": {"env": []}, "version": version}
    (out / "config.json").write_text(json.dumps(config) + "\n")
    fake = hashlib.sha256(b"fake package %d" % version).hexdigest()
    meta = {"format": 1, "bundle_sha256": bundle_digest(rootfs, config), "arch": arch, "engine": "onnxruntime",
            "package": {"name": "fake", "package_sha256": fake, "model_sha256": fake, "tokenizer_sha256": None}}
    (out / "edge-bundle.json").write_text(json.dumps(meta) + "\n")
    return out


def pack(bundle: Path, key: Path, out: Path, **kw) -> Path:
    """The real packer (zstd)."""
    return pack_bundle(bundle, key, out, **kw).path


def _tarinfo(name: str, kind: bytes, mode: int = 0o644, size: int = 0, mtime: int = 0, target: str = ""):
    ti = tarfile.TarInfo(name)
    ti.type, ti.mode, ti.size, ti.mtime, ti.linkname = kind, mode, size, mtime, target
    return ti


def pack_crafted(bundle: Path, key: Path, out: Path, *, edit: Callable[[dict], None] | None = None,
                 resign: Callable[[bytes], bytes] | None = None, skip: frozenset = frozenset(),
                 rename: dict[str, str] | None = None,
                 extra: Callable[[tarfile.TarFile], None] | None = None) -> Path:
    """The archive the packer would write, made wrong: ``edit`` changes the manifest before it is
    signed, ``resign`` changes its bytes after, ``skip`` leaves members out, ``rename`` gives
    members another name than their entry's, ``extra`` adds members after the last. The members
    are the bundle's as the packer would write them, whatever ``edit`` did to the manifest."""
    rename = rename or {}
    meta = json.loads((bundle / "edge-bundle.json").read_text())
    private = keys.load_private(key)
    entries, host, _ = scan_bundle(bundle)
    from edge.update.archive.manifest import Compatible

    manifest = make_manifest(meta, entries, keys.key_id(private.public_key()),
                             Compatible(arch=meta["arch"], l4t=None, devices=[]), package_identity(meta))
    m = manifest.model_dump(mode="json")
    members = manifest.model_dump(mode="json")["files"]  # as the bundle is, whatever the edit says
    if edit:
        edit(m)
    data = json.dumps(m, indent=1).encode()
    signature = keys.sign(private, data)
    if resign:
        data = resign(data)
    with open(out, "wb") as raw:
        sink = compressing_writer(raw, "zstd", level=1)
        with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            tar.addfile(_tarinfo(MANIFEST_MEMBER, tarfile.REGTYPE, size=len(data)), io.BytesIO(data))
            tar.addfile(_tarinfo(SIGNATURE_MEMBER, tarfile.REGTYPE, size=len(signature)), io.BytesIO(signature))
            for e in members:
                name = rename.get(e["path"], e["path"])
                if e["path"] in skip:
                    continue
                if e["type"] == "dir":
                    tar.addfile(_tarinfo(name, tarfile.DIRTYPE, mode=e["mode"]))
                elif e["type"] == "symlink":
                    tar.addfile(_tarinfo(name, tarfile.SYMTYPE, mode=0o777, target=e["target"]))
                else:
                    content = Path(host[e["path"]]).read_bytes() if e["path"] in host else b""
                    tar.addfile(_tarinfo(name, tarfile.REGTYPE, mode=e["mode"], size=len(content),
                                         mtime=e["mtime"]), io.BytesIO(content))
            if extra:
                extra(tar)
        sink.close()
    return out


def manifest_of_archive(archive: Path):
    with ArchiveReader(archive) as reader:
        data, _ = reader.head()
    return parse_manifest(data)
