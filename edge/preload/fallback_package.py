"""Where a package's fallback block leads (:class:`edge.preload.fallback.FallbackSpec`): its
directory, engine and device, checked as a boot would check them.

Above the manifest reader, which it uses to open a fallback package; the block's schema stays
below it, in :mod:`edge.preload.fallback`, because the manifest reader parses it.
"""

from __future__ import annotations

from pathlib import Path

from edge.errors import ErrorCode, PackageError
from edge.preload.manifest import MANIFEST_NAME, open_package

__all__ = ["resolve_fallback"]


def resolve_fallback(pkg, verify: str = "none") -> tuple[Path, str, str] | None:
    """(package directory, engine, device) of ``pkg``'s fallback; None when it names none.

    Kind ``device``: ``pkg``'s own directory. Kind ``package``: the subdirectory, opened as a
    package with ``verify`` ("none": its manifest and the manifest's own hash only, about a
    millisecond; "size" / "full" check the files ``engine`` needs as a boot would), its identity
    checked against the pin, and its tokenizer and output width against ``pkg``'s: the breaker
    hands it requests already tokenized by the primary's tokenizer, and replies of the same width.
    Raises :class:`edge.errors.PackageError` whose ``file`` is relative to ``pkg`` (e.g.
    ``fallback/model.ort``) and whose ``setting`` names the manifest field.
    """
    spec = pkg.manifest.fallback
    if spec is None:
        return None
    if spec.kind == "device":
        pkg.engine_files(spec.engine, spec.device)  # the manifest reader checked it; cheap to say so here
        return Path(pkg.root), spec.engine, spec.device
    root = Path(pkg.root) / spec.path

    def refuse(message: str, code: ErrorCode, file: str = MANIFEST_NAME, setting: str = "fallback") -> PackageError:
        return PackageError(f"fallback package {root}: {message}", code, file=f"{spec.path}/{file}", setting=setting)

    try:
        sub = open_package(root, verify=verify, engine=spec.engine)
        sub.engine_files(spec.engine, spec.device)
    except PackageError as exc:
        raise refuse(str(exc), exc.code, exc.file or MANIFEST_NAME) from None
    m, top = sub.manifest, pkg.manifest
    if m.package_sha256 != spec.package_sha256:
        raise refuse(f"its package_sha256 {m.package_sha256[:16]}... is not the {spec.package_sha256[:16]}... "
                     f"this package pins (replaced or edited)", ErrorCode.PACKAGE_HASH_MISMATCH,
                     setting="fallback.package_sha256")
    if m.tokenizer_sha256 != top.tokenizer_sha256 or m.output_dim != top.output_dim:
        raise refuse(f"its tokenizer or output width (tokenizer {str(m.tokenizer_sha256)[:16]}..., {m.output_dim} "
                     f"values) differs from this package's ({str(top.tokenizer_sha256)[:16]}..., {top.output_dim})",
                     ErrorCode.PACKAGE_INVALID)
    return root, spec.engine, spec.device
