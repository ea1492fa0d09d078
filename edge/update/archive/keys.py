"""Ed25519 signing keys of bundle archives (docs/archive.md, "Keys").

``keygen`` writes ``DIR/edge-signing.key`` (PEM PKCS#8, 0600, in a 0700 directory; it never
leaves the build host) and ``DIR/edge-signing.pub`` (PEM SubjectPublicKeyInfo). A key's id is
the first 16 hex digits of the sha256 of its raw 32-byte public key. A device trusts the
``*.pub`` files of one directory (:func:`load_trusted`).

Ed25519: 64-byte signatures, deterministic (no nonce to get wrong), and verification of the
~150 KiB manifest takes well under a millisecond, so the signature is checked before anything else.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from edge.update.archive.errors import KeyFileError, SignatureError

__all__ = ["PRIVATE_NAME", "PUBLIC_NAME", "keygen", "key_id", "load_private", "load_public", "load_trusted",
           "sign", "verify"]

PRIVATE_NAME = "edge-signing.key"
PUBLIC_NAME = "edge-signing.pub"
MAX_KEY_FILE = 64 << 10  # bytes; a PEM Ed25519 key is ~120


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """``data`` into ``path`` through a new file beside it, fsynced, then renamed over it."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # the umask may have taken bits off
        os.rename(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def keygen(out: Path, force: bool = False) -> tuple[Path, Path, str]:
    """A new key pair in ``out``: (private key path, public key path, key id).

    ``out`` is created 0700; an existing one must not be open to group or others. An existing
    key is replaced only with ``force`` (archives signed with it then need its public key kept).
    """
    out = Path(out)
    if out.exists():
        if not out.is_dir():
            raise KeyFileError(f"{out} is not a directory; give a directory for the key pair")
        perm = stat.S_IMODE(out.stat().st_mode)
        if perm & 0o077:
            raise KeyFileError(f"{out} is open to group or others (mode {perm:o}); the private key's directory "
                               f"must be 0700: `chmod 700 {out}` or give a new directory")
    else:
        out.mkdir(mode=0o700, parents=True)
        os.chmod(out, 0o700)
    private_path, public_path = out / PRIVATE_NAME, out / PUBLIC_NAME
    present = [p for p in (private_path, public_path) if p.exists() or p.is_symlink()]
    if present and not force:
        raise KeyFileError(f"{present[0]} exists; pass --force to replace the key pair (archives it signed "
                           f"will then verify only where its old public key is still trusted)")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    _write_new(private_path, pem, 0o600)
    _write_new(public_path, pub, 0o644)
    return private_path, public_path, key_id(key.public_key())


def _read_key_file(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_KEY_FILE + 1)
    except FileNotFoundError:
        raise KeyFileError(f"{path}: no such key file") from None
    except IsADirectoryError:
        raise KeyFileError(f"{path} is a directory, not a key file") from None
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if len(data) > MAX_KEY_FILE:
        raise KeyFileError(f"{path} is not a PEM key (over {MAX_KEY_FILE} bytes)")
    return data


def load_private(path: Path) -> Ed25519PrivateKey:
    """The private key of ``path``; refused when group or others may read it (as ssh does)."""
    path = Path(path)
    data = _read_key_file(path)
    perm = stat.S_IMODE(path.stat().st_mode)
    if perm & 0o077:
        raise KeyFileError(f"{path} is open to group or others (mode {perm:o}); `chmod 600 {path}`")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path} is not an unencrypted PEM private key ({exc}); make one with "
                           f"`edge-bundle keygen --out DIR`") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path} holds a {type(key).__name__}, not an Ed25519 key")
    return key


def load_public(path: Path) -> Ed25519PublicKey:
    path = Path(path)
    data = _read_key_file(path)
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path} is not a PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{path} holds a {type(key).__name__}, not an Ed25519 key")
    return key


def load_trusted(directory: Path) -> dict[str, Ed25519PublicKey]:
    """The public keys ``directory/*.pub`` by key id; KeyFileError when there is none."""
    directory = Path(directory)
    if not directory.is_dir():
        raise KeyFileError(f"{directory}: no such directory of trusted keys (*.pub)")
    keys = {}
    for p in sorted(directory.glob("*.pub")):
        k = load_public(p)
        keys[key_id(k)] = k
    if not keys:
        raise KeyFileError(f"{directory} holds no *.pub key; copy the build host's {PUBLIC_NAME} there")
    return keys


def sign(private: Ed25519PrivateKey, data: bytes) -> bytes:
    """The 64-byte Ed25519 signature of ``data``."""
    return private.sign(data)


def verify(signature: bytes, data: bytes, public_keys: Mapping[str, Ed25519PublicKey]) -> str:
    """The id of the key in ``public_keys`` (id -> key) that signed ``data``; SignatureError if none did."""
    if len(signature) != 64:
        raise SignatureError(f"the signature has {len(signature)} bytes; an Ed25519 signature has 64")
    for kid, key in public_keys.items():
        try:
            key.verify(signature, data)
        except InvalidSignature:
            continue
        return kid
    raise SignatureError(f"no trusted key ({', '.join(public_keys) or 'none'}) signed this manifest: "
                         f"it was signed by another key, or changed after signing")
