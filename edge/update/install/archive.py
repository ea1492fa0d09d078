"""The archive's format as the installer uses it. Its owner is ``edge/update/archive/`` (manifest.py:
the pydantic models; keys.py: Ed25519; verify.py: the one streaming pass that checks every
member against the manifest); this module is the installer's only import of it, and turns its
errors into the installer's: :func:`refusals` maps each to ``Refused(kind)`` or ``NotReady``.

Nothing here writes: reading the head and checking it is what ``install`` does before it
writes anything.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from edge.update.archive import keys as _keys
from edge.update.archive.errors import KeyFileError, ManifestError, MemberError, SignatureError
from edge.update.archive.manifest import (BUNDLE_DIR, MANIFEST_MEMBER, SIGNATURE_MEMBER, DirEntry, FileEntry, Manifest,
                                    SymlinkEntry, parse_manifest)
from edge.update.archive.verify import ArchiveReader as _Reader
from edge.update.archive.verify import check_key_id

from edge.update.install.errors import NotReady, Refused

__all__ = ["MANIFEST_NAME", "SIGNATURE_NAME", "BUNDLE_DIR", "Manifest", "FileEntry", "DirEntry", "SymlinkEntry",
           "parse_manifest", "refusals", "open_archive", "load_trusted_keys", "verify_signature", "check_key_id"]

MANIFEST_NAME = MANIFEST_MEMBER  # kept in each slot beside bundle/, under the same names
SIGNATURE_NAME = SIGNATURE_MEMBER


@contextlib.contextmanager
def refusals():
    """edge/update/archive's errors as the installer's: the check that failed becomes Refused's kind."""
    try:
        yield
    except SignatureError as exc:
        raise Refused("signature", str(exc)) from None
    except ManifestError as exc:
        raise Refused("manifest", str(exc)) from None
    except MemberError as exc:  # with a path: that member; without: the stream (damaged, cut, extra bytes)
        raise Refused("member" if exc.path else "archive", str(exc)) from None
    except KeyFileError as exc:
        raise NotReady(f"the trusted keys cannot be used: {exc}") from None
    except ImportError as exc:  # zstandard, for a zstd archive
        raise NotReady(str(exc)) from None


def open_archive(path: Path) -> _Reader:
    """edge/update/archive's one-pass reader: ``head()``, ``members(manifest)``, ``finish()``."""
    try:
        with refusals():
            return _Reader(path)
    except OSError as exc:
        raise NotReady(f"cannot read {path}: {exc.strerror or exc}") from None


def load_trusted_keys(keys_dir: Path) -> dict:
    """Key id -> public key of ``keys_dir/*.pub``; NotReady when there is none."""
    with refusals():
        return _keys.load_trusted(keys_dir)


def verify_signature(manifest_bytes: bytes, signature: bytes, trusted: dict) -> str:
    """The id of the trusted key that signed ``manifest_bytes``; Refused("signature") otherwise,
    naming the key the manifest claims when it is not trusted here."""
    try:
        return _keys.verify(signature, manifest_bytes, trusted)
    except SignatureError as exc:
        try:  # only for the message: nothing else is read from an unverified manifest
            claimed = json.loads(manifest_bytes).get("key_id")
        except (ValueError, AttributeError):
            claimed = None
        extra = (f" (it names key {claimed[:16]!r}, which is not trusted here)"
                 if isinstance(claimed, str) and claimed not in trusted else "")
        raise Refused("signature", f"{exc}{extra}") from None
