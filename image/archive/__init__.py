"""Bundle archives: one signed, compressed file of a bundle, for the trip to a device
(docs/archive.md).

    pack.py         edge-bundle pack: walk, hash, sign, write
    cli.py          the edge-bundle subcommands keygen, pack and verify-archive
    measure.py      the figures of docs/archive.md (compression, throughput)

The manifest's models, the keys, the compression and the verifying reader are the device's
side too (the installer): they live in edge/update/archive/ and load from there.

Names load on first use, so that ``import edge.update.archive.manifest`` (the installer) pulls in
neither cryptography nor zstandard, and building the command line pulls in nothing. (``sign``
and ``verify`` are ``keys.sign``/``keys.verify``: ``edge.update.archive.verify`` is the module.)
"""

from __future__ import annotations

import importlib

__all__ = ["ARCHIVE_FORMAT", "Manifest", "parse_manifest", "keygen", "load_private", "load_public", "load_trusted",
           "pack_bundle", "verify_archive", "ArchiveReader", "ArchiveError", "KeyFileError",
           "PackError", "SignatureError", "ManifestError", "MemberError"]

_WHERE = {
    "ARCHIVE_FORMAT": "manifest", "Manifest": "manifest", "parse_manifest": "manifest",
    "keygen": "keys", "load_private": "keys", "load_public": "keys", "load_trusted": "keys",
    "pack_bundle": "pack", "verify_archive": "verify", "ArchiveReader": "verify",
    "ArchiveError": "errors", "KeyFileError": "errors", "PackError": "errors", "SignatureError": "errors",
    "ManifestError": "errors", "MemberError": "errors",
}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = _WHERE[name]
    package = __name__ if module == "pack" else "edge.update.archive"  # the device's side lives in edge/update/archive/
    return getattr(importlib.import_module(f"{package}.{module}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)
