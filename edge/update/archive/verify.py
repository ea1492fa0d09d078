"""Read a bundle archive once, checking as it streams: the signature first, then the manifest,
then every member against it (docs/archive.md). Nothing is written.

The installer's path is the same, with a write where :func:`verify_archive` only reads::

    with ArchiveReader(path) as archive:
        manifest_bytes, signature = archive.head()
        key = keys.verify(signature, manifest_bytes, trusted)      # before the JSON is parsed
        manifest = parse_manifest(manifest_bytes)
        check_key_id(manifest, key)
        ...                                                         # compatibility, free space
        for entry, member, data in archive.members(manifest):
            ...                                                     # data.read() until b""
        archive.finish()

``members`` yields them in the manifest's order (the archive's member order) and checks each
member's name, type, mode, size, mtime and target before yielding it; a file's ``data`` hashes
what is read and raises :class:`MemberError` on the read that reaches its end (or ends early)
when the sha256 or size differs, before returning the last bytes. Whatever a consumer leaves
unread is read and checked when it asks for the next member. ``finish`` checks the end: no
extra member, nothing but tar padding, a complete compressed frame (its checksum), no
trailing bytes.

Bounds (before the signature is checked, only the stream's structure is trusted): the
decompressed bytes read for a member's headers and data may not exceed what its manifest
entry allows plus :data:`HEADER_ALLOWANCE`, so a hostile pax header cannot make tarfile read
gigabytes into memory; the manifest itself is at most MAX_MANIFEST_BYTES.
"""

from __future__ import annotations

import hashlib
import tarfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Protocol

from edge.update.archive.compression import DecompressingReader
from edge.update.archive.errors import ManifestError, MemberError
from edge.update.archive.manifest import (MANIFEST_MEMBER, MAX_MANIFEST_BYTES, SIGNATURE_BYTES, SIGNATURE_MEMBER, Entry,
                                    Manifest, parse_manifest)

__all__ = ["ArchiveReader", "HashingReader", "check_member", "check_key_id", "verify_archive", "HEADER_ALLOWANCE",
           "TAR_BUFSIZE"]

TAR_BUFSIZE = 1 << 20  # tarfile's reads of the stream; its 10 KiB default costs ~1/3 more time in calls
HEADER_ALLOWANCE = 16 << 10  # bytes of tar headers per member: a pax header with a 4 KiB path is ~5 KiB
_READ = 1 << 20


def _padded(size: int) -> int:
    return (size + 511) // 512 * 512


class _BoundedStream:
    """The decompressed stream as tarfile reads it, refusing to go past ``limit``; it keeps the
    last chunks it handed out, so that the bytes tarfile read ahead past the end of the tar
    archive can be checked (:meth:`zeros_from`)."""

    def __init__(self, source: DecompressingReader) -> None:
        self._source = source
        self.position = 0  # decompressed bytes handed to tarfile
        self.limit = 0
        self._recent: list[tuple[int, bytes]] = []  # (offset, chunk), the last few, oldest first

    def read(self, n: int = -1) -> bytes:
        if n < 0 or self.position + n > self.limit:
            n = max(0, self.limit - self.position) + 1  # one byte over: tells "at the limit" from "past it"
        data = self._source.read(n)
        if self.position + len(data) > self.limit:
            raise MemberError("a member's tar headers or data run past what the manifest allows "
                              "(a malformed or hostile archive)")
        self._recent.append((self.position, data))
        self.position += len(data)
        while len(self._recent) > 1 and self._recent[1][0] < self.position - 3 * TAR_BUFSIZE:
            del self._recent[0]
        return data

    def zeros_from(self, offset: int) -> bool:
        """Whether every byte handed out from ``offset`` on is zero."""
        if offset < self.position and (not self._recent or self._recent[0][0] > offset):
            return False  # not kept: cannot happen with tarfile's read-ahead of one buffer
        for start, chunk in self._recent:
            tail = chunk[max(0, offset - start):]
            if tail.count(0) != len(tail):
                return False
        return True


def _kind(member: tarfile.TarInfo) -> str:
    for word, test in (("file", member.isreg), ("dir", member.isdir), ("symlink", member.issym),
                       ("hard link", member.islnk), ("device", member.isdev), ("fifo", member.isfifo)):
        if test():
            return word
    return "special file"


def check_member(member: tarfile.TarInfo, entry: Entry) -> None:
    """``member`` is what ``entry`` says (name, type, mode, size, mtime, target); MemberError otherwise."""
    name = member.name
    if name != entry.path:
        raise MemberError(f"member {name!r} where the manifest lists {entry.path!r} (members come in the "
                          f"manifest's order; one is missing, extra or renamed)", name)
    if entry.type == "file":
        if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE) or member.sparse is not None:
            raise MemberError(f"{name}: a {_kind(member)} in the archive, a file in the manifest", name)
        if member.size != entry.size:
            raise MemberError(f"{name}: {member.size} bytes in the archive, {entry.size} in the manifest", name)
        if int(member.mtime) != entry.mtime:
            raise MemberError(f"{name}: mtime {int(member.mtime)} in the archive, {entry.mtime} in the manifest",
                              name)
    elif entry.type == "dir":
        if not member.isdir():
            raise MemberError(f"{name}: a {_kind(member)} in the archive, a directory in the manifest", name)
    else:
        if not member.issym():
            raise MemberError(f"{name}: a {_kind(member)} in the archive, a symlink in the manifest", name)
        if member.linkname != entry.target:
            raise MemberError(f"{name}: -> {member.linkname!r} in the archive, -> {entry.target!r} in the manifest",
                              name)
    if entry.type != "symlink" and member.mode != entry.mode:
        raise MemberError(f"{name}: mode {member.mode:o} in the archive, {entry.mode:o} in the manifest", name)


class _Reads(Protocol):
    def read(self, n: int, /) -> bytes: ...


class HashingReader:
    """A file member's content: ``read`` hashes as it goes and raises MemberError on the read that
    reaches the end (or finds it early) when the size or sha256 differs from ``entry``."""

    def __init__(self, raw: _Reads, entry) -> None:
        self._raw = raw
        self.entry = entry
        self._hash = hashlib.sha256()
        self.done = 0  # bytes read
        self.checked = False

    def read(self, n: int = -1) -> bytes:
        if self.checked:
            return b""
        want = self.entry.size - self.done if n < 0 else min(n, self.entry.size - self.done)
        data = self._raw.read(want) if want else b""
        self._hash.update(data)
        self.done += len(data)
        if len(data) < want:
            raise MemberError(f"{self.entry.path}: the archive ends inside it ({self.done} of "
                              f"{self.entry.size} bytes)", self.entry.path)
        if self.done == self.entry.size:
            self._check()
        return data

    def _check(self) -> None:
        digest = self._hash.hexdigest()
        if digest != self.entry.sha256:
            raise MemberError(f"{self.entry.path}: sha256 {digest[:16]}... differs from the manifest's "
                              f"{self.entry.sha256[:16]}... (corrupted or tampered)", self.entry.path)
        self.checked = True

    def drain(self) -> None:
        """Read and check what the consumer left."""
        while not self.checked:
            self.read(_READ)


class ArchiveReader:
    """One pass over an archive (see the module docstring): ``head``, ``members``, ``finish``."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._file = open(self.path, "rb")
        try:
            self._source = DecompressingReader(self._file)
        except BaseException:
            self._file.close()
            raise
        self._stream = _BoundedStream(self._source)
        self._tar: tarfile.TarFile | None = None

    def __enter__(self) -> "ArchiveReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    @property
    def compression(self) -> str:
        return self._source.kind

    @property
    def compressed_bytes(self) -> int:
        return self._source.compressed_bytes

    @property
    def decompressed_bytes(self) -> int:
        return self._source.decompressed_bytes

    def _next(self, allowed: int) -> tarfile.TarInfo | None:
        """The next member, reading at most ``allowed`` bytes of data besides its headers."""
        # tarfile reads ahead up to one buffer: what it may already hold counts too.
        self._stream.limit = self._stream.position + TAR_BUFSIZE + HEADER_ALLOWANCE + _padded(allowed)
        try:
            if self._tar is None:  # reads the first member's header: next() then returns it
                # A stream ("r|") is only read: typeshed's fileobj protocol asks for write, seek and tell too.
                self._tar = tarfile.open(fileobj=self._stream, mode="r|", bufsize=TAR_BUFSIZE)  # type: ignore[call-overload]
            return self._tar.next()
        except MemberError:
            raise
        except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
            raise MemberError(f"{self.path}: the tar stream is damaged ({type(exc).__name__}: {exc})") from None

    def _small(self, name: str, limit: int) -> bytes:
        member = self._next(limit)
        if member is None or member.name != name:
            found = "the end of the archive" if member is None else repr(member.name)
            raise MemberError(f"{self.path}: {name} must come here, found {found}: not a bundle archive "
                              f"(edge-bundle pack makes them)", None if member is None else member.name)
        if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE) or member.size > limit:
            raise MemberError(f"{name}: a {_kind(member)} of {member.size} bytes; a file of at most {limit} "
                              f"is expected", name)
        data = self._read(self._member_file(member), member.size)
        if len(data) != member.size:
            raise MemberError(f"{name}: the archive ends inside it", name)
        return data

    def _opened(self) -> tarfile.TarFile:
        """The tar stream: the first _next opened it (head() reads the first members)."""
        assert self._tar is not None
        return self._tar

    def _member_file(self, member: tarfile.TarInfo) -> IO[bytes]:
        """A file member's reader (the caller checked its type: extractfile is None for others)."""
        f = self._opened().extractfile(member)
        assert f is not None
        return f

    def _read(self, f: IO[bytes], n: int) -> bytes:
        try:
            return f.read(n)
        except MemberError:
            raise
        except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
            raise MemberError(f"{self.path}: the tar stream is damaged ({type(exc).__name__}: {exc})") from None

    def head(self) -> tuple[bytes, bytes]:
        """Members 1 and 2: the manifest's exact bytes and the signature."""
        return self._small(MANIFEST_MEMBER, MAX_MANIFEST_BYTES), self._small(SIGNATURE_MEMBER, SIGNATURE_BYTES)

    def members(self, manifest: Manifest) -> Iterator[tuple[Entry, tarfile.TarInfo, HashingReader | None]]:
        """Each member after the head, checked against its entry, with a checking reader for files."""
        for entry in manifest.files:
            member = self._next(entry.size if entry.type == "file" else 0)
            if member is None:  # tarfile takes a header whose checksum fails for the end of the archive
                why = ("the member is missing, or the archive is truncated" if self._stream.zeros_from(self._opened().offset)
                       else "a damaged tar header stands there")
                raise MemberError(f"{self.path}: the tar stream ends before {entry.path} ({why})", entry.path)
            check_member(member, entry)
            if entry.type != "file":
                yield entry, member, None
                continue
            data = HashingReader(_Guarded(self, self._member_file(member)), entry)
            yield entry, member, data
            data.drain()

    def finish(self) -> None:
        """No member after the manifest's last; the stream ends exactly (see the module docstring)."""
        extra = self._next(0)
        if extra is not None:
            raise MemberError(f"{extra.name}: a member the manifest does not list", extra.name)
        # tarfile stopped at the first zero block (tar.offset) and may have read on past it.
        if not self._stream.zeros_from(self._opened().offset):
            raise MemberError("the archive holds data after the end of its tar stream")
        self._source.finish()


class _Guarded:
    """A member's reader whose stream errors become MemberError."""

    def __init__(self, archive: ArchiveReader, f: IO[bytes]) -> None:
        self._archive, self._f = archive, f

    def read(self, n: int) -> bytes:
        return self._archive._read(self._f, n)


def check_key_id(manifest: Manifest, signer: str) -> None:
    """The manifest names the key that signed it (the signature is checked first; this catches a
    manifest signed by one trusted key that claims another)."""
    if manifest.key_id != signer:
        raise ManifestError(f"{MANIFEST_MEMBER}: key_id {manifest.key_id} but key {signer} signed it")


def verify_archive(path: Path | str, trusted_keys: Mapping | Path | str) -> Manifest:
    """Check the archive at ``path`` against ``trusted_keys`` (key id -> Ed25519 public key, or a
    directory of ``*.pub``) in one pass; the manifest when every check passed."""
    from edge.update.archive import keys

    if not isinstance(trusted_keys, Mapping):
        trusted_keys = keys.load_trusted(Path(trusted_keys))
    with ArchiveReader(path) as archive:
        manifest_bytes, signature = archive.head()
        signer = keys.verify(signature, manifest_bytes, trusted_keys)
        manifest = parse_manifest(manifest_bytes)
        check_key_id(manifest, signer)
        for _entry, _member, data in archive.members(manifest):
            if data is not None:
                data.drain()
        archive.finish()
    return manifest
