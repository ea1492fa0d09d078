"""fs-verity: the kernel's own check of a package file, instead of hashing it at each boot.

A file with fs-verity enabled (Linux 5.4+, ext4/f2fs/btrfs whose file system has the feature)
is read-only for good, and the kernel checks every page read from it against a Merkle tree
whose root it keeps: a changed block fails the read (EIO). ``FS_IOC_MEASURE_VERITY`` returns
the file's fs-verity digest, a sha256 over the tree's root hash and the file's size, in
microseconds. When it equals the digest the package's manifest gives for the file
(``fsverity.digests``, written by the build host with :func:`file_digest`), the file is the
one built, and stays so while it is mapped: the boot need not hash its 90 MB.

Standard library only (ioctl through ``fcntl``), so the boot's verify thread and the device's
installer use it as they are. Where the kernel or the file system has no fs-verity, or a file
has not had it enabled, :func:`measure` returns None and the boot hashes the file as before:
nothing depends on fs-verity being there. Enabling it is the installer's (:func:`enable`).

The parameters are fsverity-utils' defaults (``fsverity enable``, ``fsverity digest``): sha256,
4096-byte blocks, no salt, no signature.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import struct

__all__ = ["ALGORITHM", "BLOCK_SIZE", "file_digest", "measure", "enable", "Unsupported"]

ALGORITHM = "sha256"
BLOCK_SIZE = 4096  # bytes per Merkle tree block; fs-verity needs it <= the page size (4 KiB on a Jetson)
_HASH_ALG_SHA256 = 1  # FS_VERITY_HASH_ALG_SHA256
_DIGEST_SIZE = 32  # bytes of a sha256
_LOG_BLOCK_SIZE = 12  # log2(BLOCK_SIZE)
_READ_CHUNK = 1 << 20  # bytes read at a time by file_digest

# include/uapi/linux/fsverity.h: _IOW('f', 133, struct fsverity_enable_arg) (128 bytes) and
# _IOWR('f', 134, struct fsverity_digest) (4 bytes of header; the digest follows).
FS_IOC_ENABLE_VERITY = 0x40806685
FS_IOC_MEASURE_VERITY = 0xC0046686

# What the kernel answers where fs-verity cannot be used: no such ioctl (ENOTTY, or EINVAL from
# some file systems), a file system without the feature (EOPNOTSUPP), a kernel built without it.
_UNSUPPORTED = {errno.ENOTTY, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)}


class Unsupported(OSError):
    """fs-verity cannot be enabled on this file: the kernel, the file system or the file says no."""


def _merkle_root(path: str | os.PathLike) -> tuple[bytes, int]:
    """(the Merkle tree's root hash, the file's size in bytes): fsverity.rst's "Merkle tree"."""
    sha256 = hashlib.sha256
    level: list[bytes] = []
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_READ_CHUNK):
            size += len(chunk)
            for i in range(0, len(chunk), BLOCK_SIZE):
                block = chunk[i : i + BLOCK_SIZE]
                level.append(sha256(block.ljust(BLOCK_SIZE, b"\0")).digest())
    if size == 0:
        return b"\0" * _DIGEST_SIZE, 0  # an empty file's root hash is all zeros
    per_block = BLOCK_SIZE // _DIGEST_SIZE
    while len(level) > 1:  # hash the level's hashes, a block of them at a time, until one is left
        joined = b"".join(level)
        level = [sha256(joined[i : i + BLOCK_SIZE].ljust(BLOCK_SIZE, b"\0")).digest()
                 for i in range(0, len(joined), per_block * _DIGEST_SIZE)]
    return level[0], size


def file_digest(path: str | os.PathLike) -> str:
    """The fs-verity digest of ``path`` (hex), as ``fsverity digest`` prints it and
    ``FS_IOC_MEASURE_VERITY`` returns it once enabled: sha256 of ``struct fsverity_descriptor``.

    Computed in Python, block by block (0.1-0.3 s per 100 MB here, on SHA extensions): for the
    build host, which writes it into the manifest, never for the boot.
    """
    root, size = _merkle_root(path)
    # struct fsverity_descriptor: version, hash_algorithm, log_blocksize, salt_size, 4 reserved
    # bytes (a signature's size in old kernels; 0), data_size (le64), root_hash[64], salt[32],
    # 144 reserved bytes: 256 bytes in all.
    descriptor = struct.pack("<BBBB4xQ64s32s144x", 1, _HASH_ALG_SHA256, _LOG_BLOCK_SIZE, 0, size, root, b"")
    return hashlib.sha256(descriptor).hexdigest()


def measure(path: str | os.PathLike) -> str | None:
    """The kernel's fs-verity digest of ``path`` (hex sha256), or None when the file has no
    fs-verity (never enabled, or the kernel or file system has none). Microseconds."""
    header = struct.pack("<HH", 0, _DIGEST_SIZE)  # in: the room for the digest; out: its algorithm
    buf = bytearray(header + b"\0" * _DIGEST_SIZE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None  # the caller's own check (size, sha256) reports the missing file by name
    try:
        fcntl.ioctl(fd, FS_IOC_MEASURE_VERITY, buf, True)
    except OSError as exc:
        if exc.errno == errno.ENODATA or exc.errno in _UNSUPPORTED:
            return None
        raise
    finally:
        os.close(fd)
    algorithm, size = struct.unpack_from("<HH", buf)
    if algorithm != _HASH_ALG_SHA256 or size != _DIGEST_SIZE:
        return None  # enabled with another hash: not a digest the manifest gives
    return bytes(buf[4 : 4 + _DIGEST_SIZE]).hex()


def enable(path: str | os.PathLike) -> str:
    """Enable fs-verity on ``path`` with the manifest's parameters; returns its measured digest.

    Raises :class:`Unsupported` where the kernel, the file system or the file cannot have it
    (the boot then hashes the file), other OSErrors as they come (EBUSY or ETXTBSY: the file is
    open for writing). A file already enabled is measured as it is. Takes about as long as
    hashing the file once (the kernel builds the tree).
    """
    # struct fsverity_enable_arg: version, hash_algorithm, block_size, salt_size, salt_ptr (u64),
    # sig_size, 4 reserved bytes, sig_ptr (u64), 88 reserved bytes: 128 bytes in all.
    arg = struct.pack("<IIIIQI4xQ88x", 1, _HASH_ALG_SHA256, BLOCK_SIZE, 0, 0, 0, 0)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # fs-verity refuses a file open for writing
    try:
        try:
            fcntl.ioctl(fd, FS_IOC_ENABLE_VERITY, arg)
        except OSError as exc:
            code = exc.errno or 0
            if code in _UNSUPPORTED:
                raise Unsupported(code, f"fs-verity is not available for {path}: {os.strerror(code)}") from None
            if code != errno.EEXIST:  # EEXIST: enabled already
                raise
    finally:
        os.close(fd)
    digest = measure(path)
    if digest is None:
        raise Unsupported(errno.EOPNOTSUPP, f"fs-verity was enabled on {path} but cannot be measured")
    return digest
