"""Open and verify a model package (the directory ``image/package.py`` writes).

The manifest is validated once, at boot, with pydantic. A package whose manifest, file
sizes or hashes do not match is refused with :class:`edge.errors.PackageError`, whose
``file`` names the offending file.

Identity: ``model_sha256`` (over the model files), ``tokenizer_sha256`` (``tokenizer.fb``)
and ``package_sha256`` (the manifest itself minus that field) go into every reply.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from edge.errors import ErrorCode, PackageError

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "TOKENIZER_FILE",
    "FileEntry",
    "TensorSpec",
    "Serving",
    "Manifest",
    "ModelPackage",
    "open_package",
    "sha256_file",
    "manifest_digest",
    "model_digest",
]

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
TOKENIZER_FILE = "tokenizer.fb"
_CHUNK = 1 << 20  # bytes read per hashing step


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)  # bytes


class TensorSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    dtype: Literal["int64", "int32", "float32", "float16"]
    shape: list[int | str]  # symbolic dims are names ("batch", "sequence")


class Serving(BaseModel):
    """Package settings used by warm-up and the scheduler."""

    model_config = ConfigDict(extra="allow")
    buckets: list[int] = [16, 32, 64, 128, 256]  # tokens per row, ascending
    batch_sizes: list[int] = [1, 2, 4, 8, 16, 32]  # rows warmed per bucket
    max_batch_size: int = 32  # rows
    max_batch_tokens: int = 8192  # rows x bucket length
    max_delay_ms: float = 2.0  # oldest request's wait before a partial batch goes
    max_queue_requests: int = 1024
    max_queue_tokens: int = 262144

    @field_validator("buckets", "batch_sizes")
    @classmethod
    def _ascending(cls, v: list[int]) -> list[int]:
        if not v or any(x <= 0 for x in v) or v != sorted(set(v)):
            raise ValueError("must be non-empty, positive and strictly ascending")
        return v


class Manifest(BaseModel):
    model_config = ConfigDict(extra="allow")  # newer writers may add fields; format_version guards breaks
    format_version: int
    name: str
    model_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    tokenizer_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    package_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    files: dict[str, FileEntry]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    output_dim: int = Field(gt=0)
    max_seq_length: int = Field(gt=0)  # tokens, specials included
    pooling: Literal["mean", "cls"]
    normalize: bool
    vocab_size: int = Field(gt=0)  # rows of the word-embedding table in this package
    engines: dict[str, dict]  # engine name -> {"files": [...], ...}
    serving: Serving
    source: dict
    tool_versions: dict[str, str]
    nondeterministic: dict[str, str] = {}  # file -> why two exports differ

    @property
    def tokenizer(self) -> str:
        """File name of the compiled tokenizer."""
        return TOKENIZER_FILE

    def serving_dict(self) -> dict:
        """The serving settings as a plain dict (warm-up and the scheduler read these)."""
        return self.serving.model_dump()

    @field_validator("files")
    @classmethod
    def _plain_names(cls, v: dict[str, FileEntry]) -> dict[str, FileEntry]:
        for name in v:
            if not name or name != os.path.basename(name) or name in (".", "..", MANIFEST_NAME):
                raise ValueError(f"file name {name!r} must be a plain file name inside the package")
        return v


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in 1 MiB steps into one reused buffer."""
    h = hashlib.sha256()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def manifest_digest(data: dict) -> str:
    """sha256 of the canonical JSON of a manifest without its ``package_sha256``."""
    body = {k: v for k, v in data.items() if k != "package_sha256"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def model_digest(files: dict[str, str]) -> str:
    """sha256 over ``"name sha256\\n"`` of the model files (every file but the tokenizer), sorted."""
    lines = "".join(f"{n} {files[n]}\n" for n in sorted(files) if n != TOKENIZER_FILE)
    return hashlib.sha256(lines.encode()).hexdigest()


class ModelPackage:
    """An opened package: ``root``, the validated ``manifest``, paths and verification."""

    def __init__(self, root: Path, manifest: Manifest) -> None:
        self.root = root
        self.manifest = manifest

    def __repr__(self) -> str:
        return f"ModelPackage({str(self.root)!r}, name={self.manifest.name!r})"

    @property
    def identity(self) -> dict[str, str | None]:
        m = self.manifest
        return {"model_sha256": m.model_sha256, "tokenizer_sha256": m.tokenizer_sha256,
                "package_sha256": m.package_sha256}

    def engine_files(self, engine: str, device: str = "cpu") -> list[str]:
        """Files engine ``engine`` reads on ``device`` ("cpu", or a CUDA device: ORT then reads model.onnx)."""
        spec = self.manifest.engines.get(engine)
        if spec is None:
            raise PackageError(f"package {self.root} has no files for engine {engine!r} "
                               f"(it has {', '.join(self.manifest.engines)})", ErrorCode.PACKAGE_INVALID,
                               file=MANIFEST_NAME, setting="engine")
        key = "files" if device == "cpu" or "gpu_files" not in spec else "gpu_files"
        return list(spec[key])

    def path(self, name: str) -> Path:
        """Path of a file the manifest names (PackageError if it names no such file)."""
        if name not in self.manifest.files:
            raise PackageError(f"package {self.root} has no file {name!r} in its manifest",
                               ErrorCode.PACKAGE_FILE_MISSING, file=name)
        return self.root / name

    def verify_files(self, names: Iterable[str] | None = None, *, full: bool = True) -> None:
        """Check existence and size of ``names`` (default: all), and their sha256 when ``full``."""
        for name in self.manifest.files if names is None else names:
            entry = self.manifest.files.get(name)
            if entry is None:
                raise PackageError(f"{name}: not listed in the manifest", ErrorCode.PACKAGE_FILE_MISSING, file=name)
            p = self.root / name
            try:
                size = p.stat().st_size
            except FileNotFoundError:
                raise PackageError(f"{name}: missing from package {self.root}", ErrorCode.PACKAGE_FILE_MISSING,
                                   file=name) from None
            if size != entry.size:
                raise PackageError(f"{name}: size {size} bytes, manifest says {entry.size} (truncated or replaced)",
                                   ErrorCode.PACKAGE_SIZE_MISMATCH, file=name)
            if full:
                digest = sha256_file(p)
                if digest != entry.sha256:
                    raise PackageError(f"{name}: sha256 {digest[:16]}... differs from the manifest's "
                                       f"{entry.sha256[:16]}... (tampered or corrupted)",
                                       ErrorCode.PACKAGE_HASH_MISMATCH, file=name)


def _load_manifest(root: Path) -> Manifest:
    path = root / MANIFEST_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise PackageError(f"{MANIFEST_NAME} missing in {root}", ErrorCode.PACKAGE_FILE_MISSING,
                           file=MANIFEST_NAME) from None
    except IsADirectoryError:
        raise PackageError(f"{MANIFEST_NAME} in {root} is not a file", ErrorCode.PACKAGE_INVALID,
                           file=MANIFEST_NAME) from None
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PackageError(f"{MANIFEST_NAME}: not valid JSON ({exc})", ErrorCode.PACKAGE_INVALID,
                           file=MANIFEST_NAME) from None
    if not isinstance(data, dict):
        raise PackageError(f"{MANIFEST_NAME}: not a JSON object", ErrorCode.PACKAGE_INVALID, file=MANIFEST_NAME)
    if data.get("format_version") != FORMAT_VERSION:
        raise PackageError(f"{MANIFEST_NAME}: format_version {data.get('format_version')!r} unsupported "
                           f"(this runtime reads {FORMAT_VERSION})", ErrorCode.PACKAGE_INVALID, file=MANIFEST_NAME)
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise PackageError(f"{MANIFEST_NAME}: {where}: {first['msg']} ({exc.error_count()} error(s))",
                           ErrorCode.PACKAGE_INVALID, file=MANIFEST_NAME) from None
    if manifest_digest(data) != manifest.package_sha256:
        raise PackageError(f"{MANIFEST_NAME}: package_sha256 does not match its content (edited manifest)",
                           ErrorCode.PACKAGE_HASH_MISMATCH, file=MANIFEST_NAME)
    hashes = {n: e.sha256 for n, e in manifest.files.items()}
    if model_digest(hashes) != manifest.model_sha256:
        raise PackageError(f"{MANIFEST_NAME}: model_sha256 does not match the model files' hashes",
                           ErrorCode.PACKAGE_HASH_MISMATCH, file=MANIFEST_NAME)
    tok = hashes.get(TOKENIZER_FILE)
    if tok != manifest.tokenizer_sha256:
        raise PackageError(f"{MANIFEST_NAME}: tokenizer_sha256 does not match {TOKENIZER_FILE}'s hash",
                           ErrorCode.PACKAGE_HASH_MISMATCH, file=MANIFEST_NAME)
    for engine, spec in manifest.engines.items():
        for name in [*spec.get("files", []), *spec.get("gpu_files", [])]:
            if name not in manifest.files:
                raise PackageError(f"{MANIFEST_NAME}: engine {engine} needs {name}, which the manifest does not list",
                                   ErrorCode.PACKAGE_INVALID, file=MANIFEST_NAME)
    return manifest


def open_package(path: str | os.PathLike, verify: Literal["full", "size", "none"] = "full") -> ModelPackage:
    """Open the package at ``path``; check every file's size (``"size"``) and sha256 (``"full"``).

    ``"none"`` still validates the manifest itself (schema and its own hash).
    """
    if verify not in ("full", "size", "none"):
        raise ValueError(f"verify must be 'full', 'size' or 'none', not {verify!r}")
    root = Path(path)
    if not root.is_dir():
        raise PackageError(f"model package {root} is not a directory", ErrorCode.PACKAGE_FILE_MISSING,
                           file=str(root), setting="package path")
    pkg = ModelPackage(root, _load_manifest(root))
    if verify != "none":
        pkg.verify_files(full=verify == "full")
    return pkg
