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
under ~400 lines; where the block leads is :mod:`edge.preload.fallback_package`, above the manifest reader.
"""

from __future__ import annotations


from edge.preload.schema import FrozenRecord, Invalid, dict_of, one_of, sha256_hex, string

__all__ = ["FallbackSpec", "FALLBACK_KINDS", "FALLBACK_ENGINES", "FALLBACK_DEVICES"]

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
    # The fields' types for mypy: annotations only, so no class attribute clashes with __slots__.
    kind: str
    engine: str
    device: str
    path: str | None
    package_sha256: str | None
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
