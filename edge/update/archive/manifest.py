"""The manifest of a bundle archive, format 1 (docs/archive.md): pydantic models shared by the
packer (build host) and the installer (device).

Imports pydantic only: the installer imports this module before it has verified anything,
and no cryptography is needed to read a manifest. edge/ never imports it (pydantic costs
150-300 ms of import on a Jetson; the boot path has its own validators).

Checks beyond the types (each names its field in pydantic's message):

* paths: relative, UTF-8, no NUL or control character, no empty, ``.`` or ``..`` component,
  under ``bundle/``; components of at most 255 bytes, paths of at most 4095;
* the list: ``bundle`` (a directory) first, each path once, each entry's parent an earlier
  directory entry (so an installer creates them in order and never writes through a symlink);
* symlinks: the target, resolved through the archive's own symlinks, stays in the bundle; under
  ``bundle/rootfs/`` an absolute target means the container's root (``bundle/rootfs``) and the
  target must stay in the rootfs;
* modes: permission bits only, no setuid or setgid;
* ``unpacked_bytes``: the sum of the files' sizes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator, model_validator

from edge.update.archive.errors import ManifestError

__all__ = ["ARCHIVE_FORMAT", "MANIFEST_MEMBER", "SIGNATURE_MEMBER", "BUNDLE_DIR", "ROOTFS_DIR", "MAX_MANIFEST_BYTES",
           "SIGNATURE_BYTES", "ENGINES", "FileEntry", "DirEntry", "SymlinkEntry", "Entry", "L4tRange", "Compatible",
           "PackageIdentity", "Manifest", "parse_manifest", "check_path", "resolve_symlink"]

ARCHIVE_FORMAT = 1
MANIFEST_MEMBER = "edge-archive.json"  # member 1
SIGNATURE_MEMBER = "edge-archive.sig"  # member 2: Ed25519 over member 1's exact bytes
SIGNATURE_BYTES = 64
BUNDLE_DIR = "bundle"  # every other member lies under it
ROOTFS_DIR = "bundle/rootfs"  # absolute symlink targets below it mean the container's root
MAX_MANIFEST_BYTES = 16 << 20  # ~700 entries of the MiniLM bundle take ~150 KiB; bounds an installer's read
ENGINES = ("onnxruntime", "torchscript")
NAME_MAX = 255  # bytes of one path component (ext4, xfs, tmpfs, squashfs)
PATH_MAX = 4095  # bytes of a path, NUL excluded
SYMLINK_HOPS = 40  # the kernel's limit too (ELOOP)

Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
KeyId = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16}$")]
Version = Annotated[str, StringConstraints(pattern=r"^[0-9]+(\.[0-9]+){0,3}$")]  # "36.4", L4T's R36.4.x
Mode = Annotated[int, Field(ge=0, le=0o7777)]


def check_path(path: str) -> str:
    """``path`` if it may name a member under ``bundle/``; ValueError saying why not."""
    if not path:
        raise ValueError("empty path")
    if "\x00" in path:
        raise ValueError("the path contains a NUL character")
    if any(c < " " or c == "\x7f" for c in path):
        raise ValueError(f"the path {path!r} contains a control character")
    if path.startswith("/"):
        raise ValueError(f"absolute path {path!r}; paths are relative, under {BUNDLE_DIR}/")
    try:
        size = len(path.encode())
    except UnicodeEncodeError:
        raise ValueError(f"the path {path!r} is not valid Unicode (a lone surrogate)") from None
    if size > PATH_MAX:
        raise ValueError(f"the path has {size} bytes, more than {PATH_MAX}")
    parts = path.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise ValueError(f"the path {path!r} has an empty, '.' or '..' component")
        if len(part.encode()) > NAME_MAX:
            raise ValueError(f"a component of {path!r} has more than {NAME_MAX} bytes")
    if parts[0] != BUNDLE_DIR:
        raise ValueError(f"the path {path!r} is not under {BUNDLE_DIR}/")
    return path


def _parent(path: str) -> str:
    return path.rpartition("/")[0]


def _root_of(path: str) -> list[str]:
    """Where an absolute target starts and what a target may not climb above."""
    return ROOTFS_DIR.split("/") if path.startswith(ROOTFS_DIR + "/") else [BUNDLE_DIR]


def resolve_symlink(path: str, target: str, links: dict[str, str], _hops: int = 0) -> str:
    """The bundle path the symlink ``path -> target`` names, following the symlinks of ``links``
    (path -> target) on the way; ValueError when it leaves its root (:func:`_root_of`) or loops.

    Resolution is by components, as the kernel does it, so that ``a/up/..`` after a symlink
    ``up`` is the parent of where ``up`` points, not ``a``.
    """
    if _hops > SYMLINK_HOPS:
        raise ValueError(f"symlink {path}: more than {SYMLINK_HOPS} levels of symlinks")
    if not target or "\x00" in target:
        raise ValueError(f"symlink {path}: empty target or a NUL in it")
    root = _root_of(path)
    if target.startswith("/") and len(root) == 1:
        raise ValueError(f"symlink {path} -> {target}: an absolute target is allowed only under {ROOTFS_DIR}/ "
                         f"(where it means the container's root)")
    stack = list(root) if target.startswith("/") else _parent(path).split("/")
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if len(stack) <= len(root):
                raise ValueError(f"symlink {path} -> {target} leaves {'/'.join(root)}/")
            stack.pop()
            continue
        stack.append(part)
        here = "/".join(stack)
        if here in links:
            resolved = resolve_symlink(here, links[here], links, _hops + 1)
            if resolved.split("/")[:len(root)] != root:
                raise ValueError(f"symlink {path} -> {target} leaves {'/'.join(root)}/ through {here}")
            stack = resolved.split("/")
    return "/".join(stack)


class _Strict(BaseModel):
    # Unknown fields are refused: a field an older installer would ignore needs a new format.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _Entry(_Strict):
    path: str

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        return check_path(v)


def _no_setid(mode: int) -> int:
    if mode & 0o6000:
        raise ValueError(f"mode {mode:o} has the setuid or setgid bit; a bundle needs neither")
    return mode


class FileEntry(_Entry):
    type: Literal["file"]
    mode: Mode  # permission bits, e.g. 420 (0o644)
    size: Annotated[int, Field(ge=0)]  # bytes
    sha256: Sha256
    mtime: Annotated[int, Field(ge=0)]  # seconds; the rootfs's .pyc files check their source's mtime

    @field_validator("mode")
    @classmethod
    def _mode(cls, v: int) -> int:
        return _no_setid(v)


class DirEntry(_Entry):
    type: Literal["dir"]
    mode: Mode

    @field_validator("mode")
    @classmethod
    def _mode(cls, v: int) -> int:
        return _no_setid(v)


class SymlinkEntry(_Entry):
    type: Literal["symlink"]
    target: Annotated[str, StringConstraints(min_length=1, max_length=PATH_MAX)]


Entry = Annotated[Union[FileEntry, DirEntry, SymlinkEntry], Field(discriminator="type")]


class L4tRange(_Strict):
    """Versions of /etc/nv_tegra_release ("R36 (release), REVISION: 4.0" is 36.4.0); None: unbounded."""

    min: Version | None = None
    max: Version | None = None

    @model_validator(mode="after")
    def _ordered(self) -> "L4tRange":
        if self.min is None and self.max is None:
            raise ValueError("give min, max or both (or l4t: null for any)")
        if self.min is not None and self.max is not None and _version(self.min) > _version(self.max):
            raise ValueError(f"min {self.min} is above max {self.max}")
        return self


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


class Compatible(_Strict):
    arch: Annotated[str, StringConstraints(pattern=r"^[a-z0-9_]{1,32}$")]  # uname -m: aarch64, x86_64
    l4t: L4tRange | None  # None: any L4T, or not a Jetson
    devices: list[Annotated[str, StringConstraints(pattern=r"^[\x21-\x7e]{1,255}$")]]  # [] = any

    @field_validator("devices")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("a device-compatible string is listed twice")
        return v


class PackageIdentity(_Strict):
    """The model package's identity, as in edge-bundle.json (and every reply's lineage)."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=255)]
    package_sha256: Sha256
    model_sha256: Sha256
    tokenizer_sha256: Sha256 | None


class Manifest(_Strict):
    format: Literal[1]
    created: datetime  # with a UTC offset
    edge_version: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    key_id: KeyId  # the signing key's id (keys.key_id); the signature check must name the same
    bundle_sha256: Sha256  # edge-bundle.json's
    engine: Literal["onnxruntime", "torchscript"]  # ENGINES
    package: PackageIdentity
    compatible: Compatible
    unpacked_bytes: Annotated[int, Field(ge=0)]  # sum of the files' sizes
    files: list[Entry]  # in the archive's member order

    @field_validator("created")
    @classmethod
    def _aware(cls, v: datetime) -> datetime:
        if v.tzinfo is None:
            raise ValueError("give a UTC offset (e.g. +00:00)")
        return v

    @model_validator(mode="after")
    def _tree(self) -> "Manifest":
        files = self.files
        if not files or files[0].path != BUNDLE_DIR or files[0].type != "dir":
            raise ValueError(f"files: the first entry must be the directory {BUNDLE_DIR!r}")
        dirs: set[str] = set()
        seen: set[str] = set()
        for i, e in enumerate(files):
            if e.path in seen:
                raise ValueError(f"files.{i}: {e.path} is listed twice")
            seen.add(e.path)
            if i and _parent(e.path) not in dirs:
                raise ValueError(f"files.{i}: the parent of {e.path} is not an earlier directory entry")
            if e.type == "dir":
                dirs.add(e.path)
        links = {e.path: e.target for e in files if e.type == "symlink"}
        for i, e in enumerate(files):
            if e.type == "symlink":
                try:
                    resolve_symlink(e.path, e.target, links)
                except ValueError as exc:
                    raise ValueError(f"files.{i}: {exc}") from None
        total = sum(e.size for e in files if e.type == "file")
        if total != self.unpacked_bytes:
            raise ValueError(f"unpacked_bytes is {self.unpacked_bytes}, the files' sizes add up to {total}")
        return self

    def to_json(self) -> bytes:
        """The bytes the packer writes (and signs)."""
        return self.model_dump_json(indent=1).encode() + b"\n"


def _message(exc: ValidationError) -> str:
    """pydantic's messages, one per error, each after the field's dotted path."""
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(x) for x in err["loc"]) or "manifest"
        parts.append(f"{where}: {err['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def parse_manifest(data: bytes) -> Manifest:
    """The manifest in ``data`` (member 1's bytes); :class:`ManifestError` naming the field."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{MANIFEST_MEMBER}: {len(data)} bytes, more than {MAX_MANIFEST_BYTES}")
    try:
        return Manifest.model_validate_json(data)
    except ValidationError as exc:
        raise ManifestError(f"{MANIFEST_MEMBER}: {_message(exc)}", exc.errors()) from None
