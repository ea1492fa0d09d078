"""The errors of bundle archives (docs/archive.md). None is recoverable by retrying the same
input: each says what is wrong with which input and what to do.

    ArchiveError                 anything this package refuses
    ├── KeyFileError             a key file or key directory that cannot be used (keygen, load_*)
    ├── PackError                a bundle that cannot be packed as asked (a fifo, an escaping symlink)
    ├── SignatureError           no trusted key signed the manifest, or there is no signature
    ├── ManifestError            the manifest is not JSON or not format 1 (pydantic's message names the field)
    └── MemberError              a member of the archive differs from the manifest, is missing or
                                 extra, or the stream ends early (truncated, corrupted, tampered)
"""

from __future__ import annotations

__all__ = ["ArchiveError", "KeyFileError", "PackError", "SignatureError", "ManifestError", "MemberError"]


class ArchiveError(Exception):
    """Base of every error of image/archive."""


class KeyFileError(ArchiveError):
    """A key file is missing, of another kind than Ed25519, or too open; or keygen would overwrite one."""


class PackError(ArchiveError):
    """The bundle cannot be packed as asked; the message names the path or the option."""


class SignatureError(ArchiveError):
    """The manifest's signature is missing or no trusted key made it."""


class ManifestError(ArchiveError, ValueError):
    """The manifest is malformed; ``errors`` holds pydantic's list (empty for a JSON or size error)."""

    def __init__(self, message: str, errors: list | None = None) -> None:
        super().__init__(message)
        self.errors = errors or []


class MemberError(ArchiveError):
    """A member does not match the manifest (name, order, type, size, sha256, mode), or the stream is cut."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path  # the member's name in the archive, when one is to blame
