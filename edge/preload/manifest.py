"""Open and verify a model package (the directory ``image/package.py`` writes).

The manifest is validated once, at boot, by explicit checks (``edge/preload/schema.py``;
pydantic would add 150-300 ms of import to every boot on this hardware). A package whose manifest, file
sizes or hashes do not match is refused with :class:`edge.errors.PackageError`, whose
``file`` names the offending file. A bundle's copy of a package holds the manifest unchanged
but only the files of the bundle's engine; ``open_package(..., engine=E)`` checks just those.

Identity: ``model_sha256`` (over the model files), ``tokenizer_sha256`` (``tokenizer.fb``)
and ``package_sha256`` (the manifest itself minus that field) go into every reply.

``fsverity`` (optional; packages built before it have none): each file's fs-verity digest. Where
the device's kernel and file system have fs-verity and the installer enabled it on a file, the
boot compares the kernel's measured digest with it instead of hashing the file
(``edge/preload/verity.py``); elsewhere it hashes, as without the field.

``sha256_chunks`` (optional; packages built before it have none): the sha256 of every 4 MiB of
each file larger than that (``edge/preload/chunks.py``). Where a file has them, its content is
checked chunk by chunk, and every boot thread with nothing else to do can take a share
(:class:`ContentCheck`); elsewhere it is hashed whole.

``selftest`` (optional; packages built before it have none): a reference text, its embedding
computed on the build host, and the thresholds ``edge selftest`` holds a running server to
(:class:`SelftestReference`, docs/selftest.md).

``fallback`` (optional): what serves when the primary cannot, another package inside this one
or this package on another engine or device (:class:`FallbackSpec`, ``edge/preload/fallback.py``).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import threading
from collections.abc import Iterable
from pathlib import Path

from edge.errors import ErrorCode, PackageError
from edge.preload.fallback import FallbackSpec
from edge.preload.schema import FrozenRecord, Invalid, Record, dict_of, integer, list_of, one_of, sha256_hex, string
from edge.preload.selftest_reference import SelftestReference
from edge.preload.serving_settings import ServingSettings
from edge.preload import chunks, verity

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "TOKENIZER_FILE",
    "DEFAULT_BOOT_BUDGET_MS",
    "SELFTEST_MIN_COSINE",
    "FileEntry",
    "TensorSpec",
    "SelftestReference",
    "FallbackSpec",
    "Manifest",
    "ModelPackage",
    "ContentCheck",
    "open_package",
    "sha256_file",
    "manifest_digest",
    "model_digest",
]

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
TOKENIZER_FILE = "tokenizer.fb"
DTYPES = ("int64", "int32", "float32", "float16")
NAME_MAX = 255  # bytes of one file name (Linux ext4, xfs, tmpfs, squashfs)
# The package's boot budget when its manifest names none (ms, exec to ready): the same figure
# as edge-coldstart's --budget-ms default (bench/coldstart/report.py DEFAULT_BUDGET_MS).
DEFAULT_BOOT_BUDGET_MS = 1500.0
# Cosine a served embedding of the reference text must reach against the stored one: the
# engines' parity tolerance against sentence-transformers (tests/engines/test_parity.py).
SELFTEST_MIN_COSINE = 0.9999


class FileEntry(FrozenRecord):
    __slots__ = ("sha256", "size")  # hex digest; bytes
    # The fields' types for mypy: annotations only, so no class attribute clashes with __slots__.
    sha256: str
    size: int

    @classmethod
    def model_validate(cls, d: object, where: str) -> "FileEntry":
        d = dict_of(d, where, keys={"sha256", "size"})
        return cls(sha256_hex(d.get("sha256"), f"{where}.sha256"), integer(d.get("size"), f"{where}.size", ge=0))


class TensorSpec(FrozenRecord):
    # name; dtype: one of DTYPES; shape: ints, or names of symbolic dims ("batch", "sequence")
    __slots__ = ("name", "dtype", "shape")
    # The fields' types for mypy: annotations only, so no class attribute clashes with __slots__.
    name: str
    dtype: str
    shape: list[int | str]

    @classmethod
    def model_validate(cls, d: object, where: str) -> "TensorSpec":
        d = dict_of(d, where, keys={"name", "dtype", "shape"})
        shape = list_of(d.get("shape"), f"{where}.shape")
        for i, dim in enumerate(shape):
            if not isinstance(dim, str):
                integer(dim, f"{where}.shape.{i}", ge=0)
        return cls(string(d.get("name"), f"{where}.name"), one_of(d.get("dtype"), DTYPES, f"{where}.dtype"), shape)


def _bad_file_name(name: str) -> str | None:
    """Why ``name`` cannot be a file of the package (None: it can).

    Checked before any path is built from it: the fault is the manifest's (PACKAGE_INVALID).
    Found later, a NUL makes ``stat`` raise ValueError and an over-long name ENAMETOOLONG,
    which the boot could only report as BOOT_STAGE_FAILED.
    """
    if not name:
        return "the name is empty"
    if "\x00" in name:
        return "the name contains a NUL character"
    if any(c < " " or c == "\x7f" for c in name):
        return "the name contains a control character"
    if name in (".", ".."):
        return "the name is a directory, not a file"
    if "/" in name or "\\" in name:  # a backslash: a Windows-built manifest's path separator
        return "the name contains a path separator (/ or \\); files lie directly in the package"
    if name == MANIFEST_NAME:
        return f"{MANIFEST_NAME} cannot list itself"
    try:
        size = len(name.encode())
    except UnicodeEncodeError:  # a lone surrogate from a \ud800 escape: no file system name
        return "the name is not valid Unicode (a lone surrogate)"
    if size > NAME_MAX:
        return f"the name has {size} bytes in UTF-8, more than {NAME_MAX} (the file system's NAME_MAX)"
    return None


def _spec_files(spec: dict) -> list[str]:
    """An engine's files: the CPU's (``files``), then the GPU's (``gpu_files``)."""
    return [*spec.get("files", ()), *spec.get("gpu_files", ())]


def _engine_spec(v: object, where: str) -> dict:
    """An engine's entry: ``files`` (required) and ``gpu_files`` list file names (checked against ``files`` later)."""
    spec = dict_of(v, where)
    if "files" not in spec:
        raise Invalid(f"{where}.files", "field required")
    for key in ("files", "gpu_files"):
        if key in spec:
            for i, name in enumerate(list_of(spec[key], f"{where}.{key}")):
                string(name, f"{where}.{key}.{i}")
    return spec


def _fsverity_digests(v: object, files: dict) -> dict[str, str]:
    """``fsverity``: {"algorithm": "sha256", "block_size": 4096, "digests": {file: hex}} -> {file: hex}.
    Only fsverity-utils' default parameters, the ones :mod:`edge.preload.verity` measures."""
    if v is None:
        return {}
    d = dict_of(v, "fsverity", keys={"algorithm", "block_size", "digests"})
    one_of(d["algorithm"], (verity.ALGORITHM,), "fsverity.algorithm")
    one_of(d["block_size"], (verity.BLOCK_SIZE,), "fsverity.block_size")
    out = {}
    for name, digest in dict_of(d["digests"], "fsverity.digests").items():
        if name not in files:
            raise Invalid(f"fsverity.digests.{name[:NAME_MAX]}", "not a file the manifest lists")
        out[name] = sha256_hex(digest, f"fsverity.digests.{name}")
    return out


def _chunk_digests(v: object, files: dict) -> dict:
    """``sha256_chunks``: {"algorithm": "sha256", "chunk_size": N, "digests": {file: [hex, ...]}},
    each list as long as the file's size says (:func:`chunks.chunk_count`); {} when absent."""
    if v is None:
        return {}
    d = dict_of(v, "sha256_chunks", keys={"algorithm", "chunk_size", "digests"})
    one_of(d["algorithm"], (chunks.ALGORITHM,), "sha256_chunks.algorithm")
    size = integer(d["chunk_size"], "sha256_chunks.chunk_size", ge=4096)
    if size > 1 << 30:
        raise Invalid("sha256_chunks.chunk_size", f"{size} bytes; at most 1 GiB")
    out = {}
    for name, digests in dict_of(d["digests"], "sha256_chunks.digests").items():
        where = f"sha256_chunks.digests.{name[:NAME_MAX]}"
        if name not in files:
            raise Invalid(where, "not a file the manifest lists")
        want = chunks.chunk_count(files[name].size, size)
        got = [sha256_hex(x, f"{where}.{i}") for i, x in enumerate(list_of(digests, where))]
        if len(got) != want:
            raise Invalid(where, f"{len(got)} digests; a file of {files[name].size} bytes has {want} chunks of {size}")
        out[name] = got
    return {"chunk_size": size, "digests": out} if out else {}


def _check_across(m: "Manifest") -> "Manifest":
    """The checks that span fields: the warm-up ids against the vocabulary and the length, the
    self-test's embedding against the output width and its fresh budgets against the engines."""
    ids = m.serving.warm_sample_ids
    if ids is not None:
        if max(ids) >= m.vocab_size:
            raise Invalid("serving.warm_sample_ids", f"id {max(ids)} is outside the vocabulary ({m.vocab_size} ids)")
        if len(ids) > m.max_seq_length:
            raise Invalid("serving.warm_sample_ids", f"{len(ids)} ids, more than max_seq_length {m.max_seq_length}")
    if m.selftest is not None and len(m.selftest.embedding) != m.output_dim:
        raise Invalid("selftest.embedding", f"{len(m.selftest.embedding)} values, but output_dim is {m.output_dim}")
    for engine in (m.selftest.fresh_boot_budget_ms if m.selftest is not None else {}):
        if engine not in m.engines:
            raise Invalid(f"selftest.fresh_boot_budget_ms.{engine}", f"this package has no files for that engine "
                                                                     f"(it has {', '.join(m.engines)})")
    if m.fallback is not None and m.fallback.kind == "device" and m.fallback.engine not in m.engines:
        raise Invalid("fallback.engine", f"{m.fallback.engine!r}: this package has no files for it "
                                         f"(it has {', '.join(m.engines)})")
    return m


class Manifest(Record):
    __slots__ = (
        "format_version",  # int
        "name",  # str
        "model_sha256",  # str
        "tokenizer_sha256",  # str | None
        "package_sha256",  # str
        "files",  # dict[str, FileEntry]
        "inputs",  # list[TensorSpec]
        "outputs",  # list[TensorSpec]
        "output_dim",  # int
        "max_seq_length",  # int: tokens, specials included
        "pooling",  # "mean" | "cls"
        "normalize",  # bool
        "vocab_size",  # int: rows of the word-embedding table in this package
        "engines",  # dict[str, dict]: engine name -> {"files": [...], ...}
        "serving",  # ServingSettings: the only source of serving defaults
        "source",  # dict
        "tool_versions",  # dict[str, str]
        "nondeterministic",  # dict[str, str]: file -> why two exports differ
        "selftest",  # SelftestReference | None: None in packages built before it
        "fallback",  # FallbackSpec | None: none named, or a kind this runtime does not know
        "fsverity",  # dict[str, str]: file -> its fs-verity digest (hex; sha256, 4096-byte blocks); {} when none
        "sha256_chunks",  # {"chunk_size": int, "digests": {file: [hex, ...]}}; {} when none
        "extra",  # dict: fields newer writers add; format_version guards breaks
    )
    # The fields' types for mypy: annotations only, so no class attribute clashes with __slots__.
    format_version: int
    name: str
    model_sha256: str
    tokenizer_sha256: str | None
    package_sha256: str
    files: dict[str, FileEntry]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    output_dim: int
    max_seq_length: int
    pooling: str
    normalize: bool
    vocab_size: int
    engines: dict[str, dict]
    serving: ServingSettings
    source: dict
    tool_versions: dict[str, str]
    nondeterministic: dict[str, str]
    selftest: SelftestReference | None
    fallback: FallbackSpec | None
    fsverity: dict[str, str]
    sha256_chunks: dict
    extra: dict
    _defaults = {"nondeterministic": dict, "selftest": lambda: None, "fallback": lambda: None, "fsverity": dict,
                 "sha256_chunks": dict, "extra": dict}

    @classmethod
    def model_validate(cls, data: object) -> "Manifest":
        """Check types and ranges of every field; raises :class:`Invalid` naming the field."""
        d = dict(dict_of(data, "manifest"))
        take = d.pop

        def need(name: str) -> object:
            if name not in d:
                raise Invalid(name, "field required")
            return take(name)

        files = {}
        for name, entry in dict_of(need("files"), "files").items():
            why = _bad_file_name(name)
            if why:  # repr: a NUL or a newline in the name stays visible in the message
                raise Invalid("files", f"entry {name[:NAME_MAX]!r}: {why}; each must be a plain file name "
                                       f"inside the package")
            files[name] = FileEntry.model_validate(entry, f"files.{name}")
        tok = take("tokenizer_sha256", None)
        selftest, fallback = take("selftest", None), take("fallback", None)
        fsverity = _fsverity_digests(take("fsverity", None), files)
        sha256_chunks = _chunk_digests(take("sha256_chunks", None), files)
        return _check_across(cls(
            format_version=integer(need("format_version"), "format_version"),
            name=string(need("name"), "name"),
            model_sha256=sha256_hex(need("model_sha256"), "model_sha256"),
            tokenizer_sha256=None if tok is None else sha256_hex(tok, "tokenizer_sha256"),
            package_sha256=sha256_hex(need("package_sha256"), "package_sha256"),
            files=files,
            inputs=[TensorSpec.model_validate(x, f"inputs.{i}") for i, x in enumerate(list_of(need("inputs"), "inputs"))],
            outputs=[TensorSpec.model_validate(x, f"outputs.{i}") for i, x in enumerate(list_of(need("outputs"), "outputs"))],
            output_dim=integer(need("output_dim"), "output_dim", ge=1),
            max_seq_length=integer(need("max_seq_length"), "max_seq_length", ge=1),
            pooling=one_of(need("pooling"), ("mean", "cls"), "pooling"),
            normalize=one_of(need("normalize"), (True, False), "normalize"),
            vocab_size=integer(need("vocab_size"), "vocab_size", ge=1),
            engines={k: _engine_spec(v, f"engines.{k}") for k, v in dict_of(need("engines"), "engines").items()},
            serving=ServingSettings.model_validate(need("serving")),
            source=dict_of(need("source"), "source"),
            tool_versions={k: string(v, f"tool_versions.{k}") for k, v in dict_of(need("tool_versions"), "tool_versions").items()},
            nondeterministic={k: string(v, f"nondeterministic.{k}") for k, v in dict_of(take("nondeterministic", {}), "nondeterministic").items()},
            selftest=None if selftest is None else SelftestReference.model_validate(selftest),
            fallback=FallbackSpec.model_validate(fallback),
            fsverity=fsverity,
            sha256_chunks=sha256_chunks,
            extra=d,
        ))

    @property
    def tokenizer(self) -> str:
        """File name of the compiled tokenizer."""
        return TOKENIZER_FILE

    def files_of(self, engine: str | None) -> list[str]:
        """The files a boot of ``engine`` needs, in manifest order: every file (``None``), else all
        but those only other engines read (a bundle carries just these: image/bundle/package_copy.py).
        An engine the manifest does not name keeps only the shared ones (the tokenizer): the boot's
        ``select_engine`` refuses it next, naming the engine (``ModelPackage.engine_files``)."""
        if engine is None:
            return list(self.files)
        own = set(_spec_files(self.engines.get(engine, {})))
        others = {n for e, spec in self.engines.items() if e != engine for n in _spec_files(spec)}
        return [n for n in self.files if n in own or n not in others]


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file.

    The file is mapped and hashed in one call: hashlib releases the GIL for
    the whole buffer, so verification in a boot thread does not starve the
    main thread (a Python read loop took the GIL back every MiB).
    """
    with open(path, "rb", buffering=0) as f:
        if os.fstat(f.fileno()).st_size == 0:
            return hashlib.sha256(b"").hexdigest()
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mapped:
            return hashlib.sha256(mapped).hexdigest()


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

    def verify_files(self, names: Iterable[str] | None = None, *, full: bool = True,
                     engine: str | None = None) -> dict[str, str]:
        """Check existence and size of ``names`` (default: the files ``engine`` needs, every file
        when None: :meth:`Manifest.files_of`), and their content when ``full``; returns how each
        file's content was checked: {name: "fsverity" | "sha256" | "size"}. On this thread alone:
        :meth:`content_check` for a check other threads can help with."""
        return self.content_check(self.manifest.files_of(engine) if names is None else names, full=full).run()

    def content_check(self, names: Iterable[str], *, full: bool = True) -> "ContentCheck":
        """The check of ``names``, to :meth:`ContentCheck.run` on one thread while others
        :meth:`ContentCheck.help`."""
        return ContentCheck(self, list(names), full=full)


class ContentCheck:
    """The files ``names`` of a package against its manifest: existence and size, then content.

    The content: the kernel's fs-verity digest of the file, when it has one equal to the
    manifest's (microseconds: ``edge/preload/verity.py``); else, where the manifest has the
    file's ``sha256_chunks``, every chunk's sha256, shared out among the thread in :meth:`run`
    and every thread in :meth:`help` (``edge/preload/chunks.py``); else the file's sha256. A
    file whose fs-verity digest differs is hashed too: only a sha256 refuses a file.
    """

    def __init__(self, pkg: ModelPackage, names: list[str], *, full: bool = True) -> None:
        self.pkg, self.names, self.full = pkg, names, full
        self._chunked: chunks.ChunkedHash | None = None
        self._published = threading.Event()  # run() has made its chunks available, or ended

    @property
    def threads(self) -> int:
        """How many threads hashed chunks (0: none were chunked)."""
        return len(self._chunked.threads) if self._chunked is not None else 0

    def run(self) -> dict[str, str]:
        """The whole check, raising PackageError for the first file that fails; how each file's
        content was checked: {name: "fsverity" | "sha256" | "size"}."""
        try:
            checked, whole, split = self._plan()
            if split:
                table = self.pkg.manifest.sha256_chunks
                self._chunked = chunks.ChunkedHash([(n, self.pkg.root / n, table["digests"][n]) for n in split],
                                                   table["chunk_size"])
        finally:
            self._published.set()
        bad = None
        try:
            for name in whole:
                _check_sha256(self.pkg.root / name, name, self.pkg.manifest.files[name].sha256)
        except BaseException:
            if self._chunked is not None:
                self._chunked.stop()  # refused already: hash no more, but let the helpers' chunks end
            raise
        finally:
            if self._chunked is not None:  # never leave a mapping to a helper that is still hashing it
                bad = self._chunked.wait()
        if bad is not None:
            name, k = bad
            at = k * self.pkg.manifest.sha256_chunks["chunk_size"]
            raise PackageError(f"{name}: the sha256 of chunk {k} (from byte {at}) differs from the manifest's "
                               f"(tampered or corrupted)", ErrorCode.PACKAGE_HASH_MISMATCH, file=name)
        return checked

    def help(self, ended: threading.Event | None = None) -> None:
        """Hash chunks of this check's files here, once :meth:`run` (on another thread) has them
        ready, until none is left to take; returns at once when none are chunked, and without
        waiting further once ``ended`` is set (the run that would share them never came)."""
        while not self._published.wait(0.01):  # the run checks sizes first: microseconds
            if ended is not None and ended.is_set():
                return
        if self._chunked is not None:
            self._chunked.help()

    def _plan(self) -> tuple[dict[str, str], list[str], list[str]]:
        """Existence, size and fs-verity of each file: (how each is checked, the names to hash
        whole, the names to hash by chunks)."""
        m, root = self.pkg.manifest, self.pkg.root
        checked: dict[str, str] = {}
        whole: list[str] = []
        split: list[str] = []
        for name in self.names:
            entry = m.files.get(name)
            if entry is None:
                raise PackageError(f"{name}: not listed in the manifest", ErrorCode.PACKAGE_FILE_MISSING, file=name)
            p = root / name
            try:
                size = p.stat().st_size
            except FileNotFoundError:
                raise PackageError(f"{name}: missing from package {root}", ErrorCode.PACKAGE_FILE_MISSING,
                                   file=name) from None
            if size != entry.size:
                raise PackageError(f"{name}: size {size} bytes, manifest says {entry.size} (truncated or replaced)",
                                   ErrorCode.PACKAGE_SIZE_MISMATCH, file=name)
            if not self.full:
                checked[name] = "size"
                continue
            want = m.fsverity.get(name)
            if want is not None and _measured(p) == want:
                checked[name] = "fsverity"
                continue
            checked[name] = "sha256"
            (split if name in m.sha256_chunks.get("digests", {}) else whole).append(name)
        return checked, whole, split


def _check_sha256(path: Path, name: str, want: str) -> None:
    digest = sha256_file(path)
    if digest != want:
        raise PackageError(f"{name}: sha256 {digest[:16]}... differs from the manifest's "
                           f"{want[:16]}... (tampered or corrupted)", ErrorCode.PACKAGE_HASH_MISMATCH, file=name)


def _measured(path: Path) -> str | None:
    """The kernel's fs-verity digest of ``path``; None when it has none or says something else
    (the file is hashed then: an error here must never be what refuses or passes a file)."""
    try:
        return verity.measure(path)
    except OSError:
        return None


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
    except Invalid as exc:
        raise PackageError(f"{MANIFEST_NAME}: {exc.where}: {exc.reason}", ErrorCode.PACKAGE_INVALID,
                           file=MANIFEST_NAME) from None
    try:
        digest = manifest_digest(data)
    except UnicodeEncodeError as exc:  # a "\ud800" escape: JSON parses it, UTF-8 cannot hold it
        raise PackageError(f"{MANIFEST_NAME}: a string holds a lone surrogate ({exc.object[exc.start]!r}); "
                           f"rebuild the package", ErrorCode.PACKAGE_INVALID, file=MANIFEST_NAME) from None
    if digest != manifest.package_sha256:
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
        for name in _spec_files(spec):
            if name not in manifest.files:
                raise PackageError(f"{MANIFEST_NAME}: engine {engine} needs {name}, which the manifest does not list",
                                   ErrorCode.PACKAGE_INVALID, file=MANIFEST_NAME)
    return manifest


def open_package(path: str | os.PathLike, verify: str = "full", engine: str | None = None) -> ModelPackage:
    """Open the package at ``path``; check every file's size (``"size"``) and sha256 (``"full"``).

    ``"none"`` still validates the manifest itself (schema and its own hash). ``engine``: check
    only the files that engine needs (:meth:`Manifest.files_of`), so that a bundle's package,
    which holds no other engine's files, opens; ``None``: every file the manifest lists.
    """
    if verify not in ("full", "size", "none"):
        raise ValueError(f"verify must be 'full', 'size' or 'none', not {verify!r}")
    root = Path(path)
    if not root.is_dir():
        raise PackageError(f"model package {root} is not a directory", ErrorCode.PACKAGE_FILE_MISSING,
                           file=str(root), setting="package path")
    pkg = ModelPackage(root, _load_manifest(root))
    if verify != "none":
        pkg.verify_files(full=verify == "full", engine=engine)
    return pkg
