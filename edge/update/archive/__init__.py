"""Bundle archives, the device's side: the manifest's models, checking signatures, one
streaming pass that verifies every member (docs/archive.md). The installer (edge/update/install/)
and the build host's packer (image/archive/) both use them; nothing here is imported at boot.

    manifest.py     the manifest's pydantic models (format 1); imports pydantic only
    keys.py         Ed25519 key pairs, signing and checking signatures (cryptography)
    compression.py  zstd (default) or xz, and a decompressing reader that checks the stream's end
    verify.py       one streaming pass that checks the signature, then every member
    errors.py       the error tree
"""
