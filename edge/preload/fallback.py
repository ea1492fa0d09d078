"""The fallback a package names: the manifest's ``fallback`` block and where it leads.

When the runtime's circuit breaker trips (docs/design.md, "Control plane"), requests go to a
declared fallback: a lighter package (the int8 one ``edge-package build --quantize int8``
writes), or the same weights on another engine or device (a Jetson's CPU when its GPU path
hangs or throttles). The package says which, so the choice is made on the build host and
travels with the package, its hashes and its bundle. Two kinds (docs/architecture.md):

* ``{"kind": "package", "path": "fallback", "package_sha256": ..., "engine": ..., "device": ...}``:
  another package, copied inside this one as the subdirectory ``path``; a package in its own
  right (its manifest, its hashes), pinned by its ``package_sha256``, which this manifest's own
  hash covers, so the primary's identity names the fallback's too;
* ``{"kind": "device", "engine": ..., "device": ...}``: this package's own files on that engine
  and device.

No ``fallback`` (or ``null``) is None. A ``kind`` this runtime does not know (a newer writer's)
is None as well: the package still serves, without a fallback, rather than being refused. A
known kind with a bad field is refused, naming the field (:class:`Invalid`, which the manifest
reader turns into :class:`edge.errors.PackageError`).

Here only reading and resolving; the breaker loads the fallback. Apart from
``edge/preload/manifest.py`` (which re-exports :class:`FallbackSpec`) to keep each module
under ~400 lines; this module imports the manifest's only inside :func:`resolve_fallback`.
"""

from __future__ import annotations

from pathlib import Path

from edge.preload.schema import FrozenRecord, Invalid, dict_of, one_of, sha256_hex, string

__all__ = ["FallbackSpec", "FALLBACK_KINDS", "FALLBACK_ENGINES", "FALLBACK_DEVICES", "resolve_fallback"]

FALLBACK_KINDS = ("package", "device")
FALLBACK_ENGINES = ("onnxruntime", "torchscript")
# A concrete device: the breaker switches to it when the primary's fails, so "auto" (which
# could resolve to the failing device again) has no place here.
FALLBACK_DEVICES = ("cpu", "cuda")
_PACKAGE_ONLY = ("path", "package_sha256")


def _subdirectory(v: object, where: str) -> str:
    """A plain directory name inside the package: the fallback lies directly in it, nowhere else."""
    name = string(v, where)
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise Invalid(where, f"{name!r} is not a directory name inside the package (no '/', not '.' or '..')")
    if any(c < " " or c == "\x7f" for c in name):
        raise Invalid(where, f"{name!r} contains a control character")
    return name


class FallbackSpec(FrozenRecord):
    """The manifest's ``fallback``: which engine on which device serves when the primary cannot."""

    __slots__ = (
        "kind",  # "package" | "device"
        "engine",  # one of FALLBACK_ENGINES
        "device",  # one of FALLBACK_DEVICES
        "path",  # str | None: the fallback package's directory inside this one (kind "package")
        "package_sha256",  # str | None: that package's identity (kind "package")
    )
    _defaults = {"path": lambda: None, "package_sha256": lambda: None}

    @classmethod
    def model_validate(cls, d: object, where: str = "fallback") -> "FallbackSpec | None":
        """None when ``d`` is None or names a kind this runtime does not know; raises :class:`Invalid`."""
        if d is None:
            return None
        d = dict_of(d, where)
        if "kind" not in d:
            raise Invalid(f"{where}.kind", "field required")
        kind = string(d["kind"], f"{where}.kind")
        if kind not in FALLBACK_KINDS:
            return None
        for name in ("engine", "device", *(_PACKAGE_ONLY if kind == "package" else ())):
            if name not in d:
                raise Invalid(f"{where}.{name}", f"field required (kind {kind!r})")
        engine = one_of(d["engine"], FALLBACK_ENGINES, f"{where}.engine")
        device = one_of(d["device"], FALLBACK_DEVICES, f"{where}.device")
        if kind == "device":
            for name in _PACKAGE_ONLY:
                if name in d:
                    raise Invalid(f"{where}.{name}", "only a fallback of kind 'package' has one")
            return cls(kind=kind, engine=engine, device=device)
        return cls(kind=kind, engine=engine, device=device, path=_subdirectory(d["path"], f"{where}.path"),
                   package_sha256=sha256_hex(d["package_sha256"], f"{where}.package_sha256"))

    def to_dict(self) -> dict:
        """The block as the manifest holds it (what ``image/quantize.py`` writes)."""
        return {n: getattr(self, n) for n in self.__slots__ if getattr(self, n) is not None}


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
    from edge.errors import ErrorCode, PackageError
    from edge.preload.manifest import MANIFEST_NAME, open_package

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
