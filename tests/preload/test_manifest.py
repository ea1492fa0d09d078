"""open_package / ModelPackage: the real package opens; tampered, truncated or missing files are refused."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from edge.errors import ErrorCode, PackageError
from edge.preload.manifest import Manifest, ModelPackage, manifest_digest, model_digest, open_package
from support.packages import clone, flip_byte, rewrite_manifest

MODEL_FILES = ["model.ts", "weights.safetensors", "model.onnx", "model.ort", "tokenizer.fb"]


def test_real_package_opens(minilm_package):
    pkg = open_package(minilm_package, verify="full")
    assert isinstance(pkg, ModelPackage) and isinstance(pkg.manifest, Manifest)
    m = pkg.manifest
    assert set(MODEL_FILES) <= set(m.files)
    for name, entry in m.files.items():
        assert pkg.path(name).stat().st_size == entry.size
    assert m.output_dim == 384 and m.max_seq_length == 256 and m.pooling == "mean" and m.normalize
    assert [(i.name, i.dtype, i.shape) for i in m.inputs] == [
        ("input_ids", "int64", ["batch", "sequence"]),
        ("attention_mask", "int64", ["batch", "sequence"]),
    ]
    assert [(o.name, o.dtype, o.shape) for o in m.outputs] == [("embedding", "float32", ["batch", 384])]
    assert m.serving.buckets == [16, 32, 64, 128, 256] and m.serving.batch_sizes == [1, 2, 4, 8, 16, 32]
    assert m.serving.max_batch_tokens == 8192 and m.serving.max_delay_ms == 2.0
    assert m.source["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert {"torch", "onnx", "onnxruntime", "python"} <= set(m.tool_versions)
    assert pkg.identity["tokenizer_sha256"] == m.files["tokenizer.fb"].sha256
    assert pkg.identity["package_sha256"] == m.package_sha256
    # every file's fs-verity digest, as a kernel with fs-verity will measure it (edge/preload/verity.py)
    from edge.preload.verity import file_digest

    assert set(m.fsverity) == set(m.files)
    assert all(m.fsverity[name] == file_digest(pkg.path(name)) for name in ("tokenizer.fb", "model.ort"))


@pytest.mark.parametrize("name", MODEL_FILES)
def test_tampered_file_is_refused_naming_it(minilm_package, tmp_path, name):
    root = clone(minilm_package, tmp_path / "pkg", copy=(name,))
    size = (root / name).stat().st_size
    flip_byte(root / name, size // 2)
    with pytest.raises(PackageError) as info:
        open_package(root, verify="full")
    assert info.value.code == ErrorCode.PACKAGE_HASH_MISMATCH
    assert info.value.file == name and name in str(info.value)
    # A size check alone cannot see a flipped byte; verify_files can, file by file.
    pkg = open_package(root, verify="size")
    with pytest.raises(PackageError) as info:
        pkg.verify_files([name])
    assert info.value.file == name


@pytest.mark.parametrize("name", ["model.ort", "weights.safetensors", "tokenizer.fb"])
@pytest.mark.parametrize("verify", ["size", "full"])
def test_truncated_file_is_refused_naming_it(minilm_package, tmp_path, name, verify):
    root = clone(minilm_package, tmp_path / "pkg", copy=(name,))
    with open(root / name, "r+b") as f:
        f.truncate((root / name).stat().st_size - 1000)
    with pytest.raises(PackageError) as info:
        open_package(root, verify=verify)
    assert info.value.code == ErrorCode.PACKAGE_SIZE_MISMATCH and info.value.file == name


def test_missing_file_is_refused(minilm_package, tmp_path):
    root = clone(minilm_package, tmp_path / "pkg")
    (root / "model.ts").unlink()
    with pytest.raises(PackageError) as info:
        open_package(root, verify="size")
    assert info.value.code == ErrorCode.PACKAGE_FILE_MISSING and info.value.file == "model.ts"


def test_missing_manifest(tmp_path):
    with pytest.raises(PackageError) as info:
        open_package(tmp_path)
    assert info.value.code == ErrorCode.PACKAGE_FILE_MISSING and info.value.file == "manifest.json"


def test_not_a_directory(tmp_path):
    with pytest.raises(PackageError) as info:
        open_package(tmp_path / "nowhere")
    assert info.value.code == ErrorCode.PACKAGE_FILE_MISSING


def test_edited_manifest_is_refused(minilm_package, tmp_path):
    root = clone(minilm_package, tmp_path / "pkg")
    rewrite_manifest(root, lambda d: d.update(max_seq_length=512), rehash=False)
    with pytest.raises(PackageError) as info:
        open_package(root, verify="none")
    assert info.value.code == ErrorCode.PACKAGE_HASH_MISMATCH and info.value.file == "manifest.json"


def test_manifest_hash_swapped_for_a_tampered_file(minilm_package, tmp_path):
    """Re-hashing the manifest is not enough: model_sha256 binds the file hashes."""
    root = clone(minilm_package, tmp_path / "pkg")
    rewrite_manifest(root, lambda d: d["files"]["model.ts"].update(sha256="0" * 64))
    with pytest.raises(PackageError) as info:
        open_package(root, verify="none")
    assert info.value.code == ErrorCode.PACKAGE_HASH_MISMATCH and info.value.file == "manifest.json"


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d.update(format_version=99),
        lambda d: d.pop("inputs"),
        lambda d: d.update(output_dim=-1),
        lambda d: d["files"].update({"../escape": {"sha256": "0" * 64, "size": 1}}),
        lambda d: d["serving"].update(buckets=[64, 32]),
        lambda d: d["engines"]["onnxruntime"]["files"].append("absent.bin"),
        lambda d: d["serving"].update(warm_sample_ids=[101, d["vocab_size"], 102]),
        lambda d: d["serving"].update(warm_sample_ids=[101] * (d["max_seq_length"] + 1)),
        lambda d: d["serving"].update(warm_sample_ids=[101, "x"]),
        lambda d: d["serving"].update(warm_sample_ids=[]),
    ],
    ids=["format_version", "no_inputs", "negative_dim", "path_escape", "unsorted_buckets", "engine_file_unlisted",
         "warm_id_outside_vocab", "warm_ids_too_long", "warm_id_not_int", "warm_ids_empty"],
)
def test_invalid_manifest_is_refused(minilm_package, tmp_path, edit):
    root = clone(minilm_package, tmp_path / "pkg")
    rewrite_manifest(root, edit)
    with pytest.raises(PackageError) as info:
        open_package(root, verify="none")
    assert info.value.code == ErrorCode.PACKAGE_INVALID and info.value.file == "manifest.json"


_ENTRY = {"sha256": "0" * 64, "size": 1}


def _add_file(d: dict, name: str, entry: dict, rehash_model: bool = True) -> None:
    d["files"][name] = entry
    if rehash_model:
        d["model_sha256"] = model_digest({n: e["sha256"] for n, e in d["files"].items()})


@pytest.mark.parametrize(
    "name,why",
    [
        ("model\x00.ort", "NUL"),
        ("\x00", "NUL"),
        ("/etc/passwd", "path separator"),
        ("../escape", "path separator"),
        ("..", "directory"),
        (".", "directory"),
        ("", "empty"),
        ("sub\\model.ort", "path separator"),
        ("..\\escape", "path separator"),
        ("model\n.ort", "control character"),
        ("x" * 256, "256 bytes"),
        ("\u00e9" * 128, "256 bytes"),  # 128 characters, 256 bytes of UTF-8
        ("bad\ud800", "lone surrogate"),
        ("manifest.json", "cannot list itself"),
    ],
    ids=["nul", "only_nul", "absolute", "dotdot_path", "dotdot", "dot", "empty", "backslash", "backslash_dotdot",
         "newline", "too_long", "too_long_utf8", "surrogate", "manifest_itself"],
)
@pytest.mark.parametrize("verify", ["none", "full"])
def test_malformed_file_name_is_package_invalid_naming_the_entry(minilm_package, tmp_path, name, why, verify):
    """Every malformed name is the manifest's fault (4000), never a boot stage failure (4030)."""
    root = clone(minilm_package, tmp_path / "pkg")
    # Both hashes re-made: the name is the manifest's only fault (old code: ValueError or ENAMETOOLONG in
    # stat, 4030). A lone surrogate cannot be hashed; the name check comes first, so no stale hash is read.
    rewrite_manifest(root, lambda d: _add_file(d, name, _ENTRY, rehash_model=why != "lone surrogate"),
                     rehash=why != "lone surrogate")
    with pytest.raises(PackageError) as info:
        open_package(root, verify=verify)
    err = info.value
    assert err.code == ErrorCode.PACKAGE_INVALID and int(err.code) == 4000, str(err)
    assert err.file == "manifest.json"
    assert f"entry {name[:255]!r}" in err.message and why in err.message, err.message
    assert "\x00" not in str(err)  # repr shows a NUL as \x00


def test_longest_file_name_is_accepted(minilm_package, tmp_path):
    """255 bytes is allowed (NAME_MAX); the file then only has to exist with its size."""
    root = clone(minilm_package, tmp_path / "pkg")
    name = "x" * 255
    (root / name).write_bytes(b"y")
    rewrite_manifest(root, lambda d: _add_file(d, name, {"sha256": hashlib.sha256(b"y").hexdigest(), "size": 1}))
    assert name in open_package(root, verify="full").manifest.files


def test_lone_surrogate_elsewhere_is_package_invalid(minilm_package, tmp_path):
    root = clone(minilm_package, tmp_path / "pkg")
    rewrite_manifest(root, lambda d: d.update(name="bad\ud800"), rehash=False)
    with pytest.raises(PackageError) as info:
        open_package(root, verify="none")
    assert info.value.code == ErrorCode.PACKAGE_INVALID and "lone surrogate" in info.value.message


@pytest.mark.parametrize(
    "edit,where",
    [
        (lambda d: d["engines"]["onnxruntime"].update(files="model.ort"), "engines.onnxruntime.files"),
        (lambda d: d["engines"]["onnxruntime"].update(files=[["model.ort"]]), "engines.onnxruntime.files.0"),
        (lambda d: d["engines"]["onnxruntime"].update(gpu_files=[1]), "engines.onnxruntime.gpu_files.0"),
        (lambda d: d["engines"]["onnxruntime"].pop("files"), "engines.onnxruntime.files"),
    ],
    ids=["files_a_string", "name_a_list", "name_a_number", "no_files"],
)
def test_engine_file_lists_are_lists_of_names(minilm_package, tmp_path, edit, where):
    root = clone(minilm_package, tmp_path / "pkg")
    rewrite_manifest(root, edit)
    with pytest.raises(PackageError) as info:
        open_package(root, verify="none")
    assert info.value.code == ErrorCode.PACKAGE_INVALID and where in info.value.message, info.value.message


def test_manifest_not_json(tmp_path):
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(PackageError) as info:
        open_package(tmp_path)
    assert info.value.code == ErrorCode.PACKAGE_INVALID and info.value.file == "manifest.json"


def test_path_of_unlisted_file(minilm_package):
    pkg = open_package(minilm_package, verify="none")
    with pytest.raises(PackageError) as info:
        pkg.path("other.bin")
    assert info.value.file == "other.bin"


def test_load_engine_refuses_a_truncated_package(minilm_package, tmp_path):
    from edge.engines import load_engine

    root = clone(minilm_package, tmp_path / "pkg", copy=("model.ort",))
    with open(root / "model.ort", "r+b") as f:
        f.truncate(4096)
    with pytest.raises(PackageError) as info:
        load_engine(root, "onnxruntime", device="cpu")
    assert info.value.file == "model.ort"


def test_warm_sample_ids_are_optional_and_round_trip(minilm_package, tmp_path):
    pkg = open_package(minilm_package, verify="none")
    ids = pkg.manifest.serving.warm_sample_ids
    assert ids and pkg.manifest.serving.warm_sample_ids == ids
    root = clone(minilm_package, tmp_path / "old")
    rewrite_manifest(root, lambda d: d["serving"].pop("warm_sample_ids"))  # a package from before the field
    old = open_package(root, verify="none").manifest
    assert old.serving.warm_sample_ids is None and "warm_sample_ids" not in old.serving.model_dump()


# ------------------------------------------------------------------ a package of one engine (a bundle's)

# What each engine's bundle carries of the MiniLM package besides manifest.json (image/bundle/package_copy.py).
ENGINE_SHARE = {"onnxruntime": {"tokenizer.fb", "model.ort", "model.onnx"},
                "torchscript": {"tokenizer.fb", "model.ts", "weights.safetensors"}}


def engine_share(src: Path, dst: Path, engine: str) -> Path:
    """A package directory as a bundle of ``engine`` holds it: the manifest, unchanged, and
    links to the tokenizer and the engine's own files only."""
    dst.mkdir()
    shutil.copyfile(src / "manifest.json", dst / "manifest.json")
    for name in ENGINE_SHARE[engine]:
        (dst / name).symlink_to((src / name).resolve())
    return dst


def write_synthetic(root: Path, names: list[str], engines: dict) -> None:
    """A small valid package listing ``names`` (each a file of a few bytes) and ``engines``."""
    root.mkdir()
    files = {}
    for name in names:
        data = name.encode() * 3
        (root / name).write_bytes(data)
        files[name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    hashes = {n: e["sha256"] for n, e in files.items()}
    data = {"format_version": 1, "name": "synthetic", "model_sha256": model_digest(hashes),
            "tokenizer_sha256": hashes.get("tokenizer.fb"), "files": files, "inputs": [], "outputs": [],
            "output_dim": 4, "max_seq_length": 16, "pooling": "mean", "normalize": True, "vocab_size": 32,
            "engines": engines, "serving": {}, "source": {}, "tool_versions": {}}
    data["package_sha256"] = manifest_digest(data)
    (root / "manifest.json").write_text(json.dumps(data))


_SYNTHETIC_ENGINES = {"a": {"files": ["a.bin", "shared.bin"], "gpu_files": ["a.gpu"]},
                      "b": {"files": ["b.bin", "shared.bin"]}}
_SYNTHETIC_FILES = ["tokenizer.fb", "a.bin", "a.gpu", "b.bin", "shared.bin", "vocab.extra"]


@pytest.mark.parametrize("engine,expected", [
    (None, _SYNTHETIC_FILES),
    ("a", ["tokenizer.fb", "a.bin", "a.gpu", "shared.bin", "vocab.extra"]),
    ("b", ["tokenizer.fb", "b.bin", "shared.bin", "vocab.extra"]),
    ("c", ["tokenizer.fb", "vocab.extra"]),  # named by no engine: only the files no engine claims
])
def test_files_of_an_engine_leave_out_only_what_other_engines_alone_read(tmp_path, engine, expected):
    write_synthetic(tmp_path / "pkg", _SYNTHETIC_FILES, _SYNTHETIC_ENGINES)
    assert open_package(tmp_path / "pkg", verify="full").manifest.files_of(engine) == expected


def test_synthetic_engine_share_opens_for_its_engine_only(tmp_path):
    root = tmp_path / "pkg"
    write_synthetic(root, _SYNTHETIC_FILES, _SYNTHETIC_ENGINES)
    (root / "b.bin").unlink()  # the one file only b reads: what a bundle of a leaves out
    for verify in ("size", "full"):
        assert open_package(root, verify=verify, engine="a").manifest.name == "synthetic"
    with pytest.raises(PackageError) as info:
        open_package(root, verify="size", engine="b")
    assert info.value.code == ErrorCode.PACKAGE_FILE_MISSING and info.value.file == "b.bin"
    with pytest.raises(PackageError) as info:
        open_package(root, verify="size")  # engine None: every file, as before
    assert info.value.code == ErrorCode.PACKAGE_FILE_MISSING and info.value.file == "b.bin"


@pytest.mark.parametrize("engine", sorted(ENGINE_SHARE))
def test_a_package_of_one_engine_opens_for_that_engine(minilm_package, tmp_path, engine):
    root = engine_share(minilm_package, tmp_path / "pkg", engine)
    pkg = open_package(root, verify="full", engine=engine)
    assert set(pkg.manifest.files_of(engine)) == ENGINE_SHARE[engine]
    assert pkg.identity == open_package(minilm_package, verify="none").identity  # the manifest is unchanged
    pkg.verify_files(engine=engine)
    for device in ("cpu", "cuda"):
        assert set(pkg.engine_files(engine, device)) <= ENGINE_SHARE[engine]
    other = next(e for e in ENGINE_SHARE if e != engine)
    with pytest.raises(PackageError) as info:
        open_package(root, verify="size")  # every file: the other engine's are not there
    assert info.value.code == ErrorCode.PACKAGE_FILE_MISSING and info.value.file in ENGINE_SHARE[other]
    with pytest.raises(PackageError) as info:
        open_package(root, verify="size", engine=other)
    assert info.value.code == ErrorCode.PACKAGE_FILE_MISSING and info.value.file in ENGINE_SHARE[other]


@pytest.mark.parametrize("engine,name", [(e, n) for e in sorted(ENGINE_SHARE) for n in sorted(ENGINE_SHARE[e])])
def test_a_package_of_one_engine_missing_one_of_its_files_is_refused_naming_it(minilm_package, tmp_path, engine,
                                                                                name):
    root = engine_share(minilm_package, tmp_path / "pkg", engine)
    (root / name).unlink()
    for verify in ("size", "full"):
        with pytest.raises(PackageError) as info:
            open_package(root, verify=verify, engine=engine)
        assert info.value.code == ErrorCode.PACKAGE_FILE_MISSING and info.value.file == name
        assert name in str(info.value)


def test_load_engine_opens_a_package_of_its_engine(minilm_package, tmp_path):
    """load_engine given a directory checks only its engine's files (a bundle's package)."""
    from edge.engines import load_engine

    root = engine_share(minilm_package, tmp_path / "pkg", "onnxruntime")
    engine = load_engine(root, "onnxruntime", device="cpu")
    try:
        assert engine.name == "onnxruntime"
    finally:
        engine.close()
