"""The lighter model and the fallback a package names: the build side of both (``image/package.py`` calls it).

``edge-package build --quantize int8`` writes a package whose ONNX Runtime model is dynamically
quantized to int8 by ONNX Runtime's own tool (``onnxruntime.quantization.quantize_dynamic``),
then converted to ORT format like the full package's. It carries the onnxruntime engine only
(TorchScript has no int8 path here), and its manifest says what was done and what it costs:
``quantization`` (:func:`measure`), figures measured in this process on the parity texts
against the full (fp32) model of the same export, both run by the runtime's own ONNX Runtime
engine on the package's own tokenizer, in bucket batches as the runtime serves them.

Which weights are int8 (:data:`INT8_NODES`): quantizing every MatMul (what ``quantize_dynamic``
does by default) gives cos 0.967 at worst on the parity texts; the activations are quantized
per batch, per tensor, to uint8, and MiniLM's feed-forward inputs have a few outlier channels
that take most of that range. Each of the 24 weight MatMuls and the word-embedding table was
quantized alone and its cost measured (1 - worst cosine, docs/architecture.md has the table);
the list keeps the cheap ones, added greedily while the worst cosine stayed >= 0.992: the
embedding table (the largest tensor, 47 MB; weight-only, so no activation error), every
attention output projection, the Q/K/V projection of layers 0-3, the feed-forward input of
layers 0 and 5 and the feed-forward output of layers 3-5. Per-channel weight scales (per
output column; all MatMuls int8: worst cosine 0.967 against 0.813 per tensor), weights in a reduced
range (:data:`REDUCE_RANGE`: 7 bits, so that no CPU's kernel saturates; see there),
``MatMulConstBOnly`` (the attention's activation-by-activation products stay float). A build whose worst cosine falls
under :data:`MIN_COSINE` fails: a fallback that does not meet the bar is not written.

Determinism: the quantizer is numpy arithmetic and writes the same bytes twice; the cosine
figures run on one thread and are the same twice. The timings are not, so they go to
:data:`REPORT_FILE` beside the manifest, a build report that no hash covers and
``compare_builds`` skips: the package's identity stays byte-for-byte reproducible.

Fallbacks (``--fallback-package DIR``, ``--fallback-engine``, ``--fallback-device``): the
manifest's ``fallback`` block (``edge/preload/fallback.py`` reads it), and for a fallback
package its copy in the subdirectory :data:`FALLBACK_DIR`, checked to be usable in its place.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from hashlib import sha256
from importlib import metadata
from pathlib import Path

import numpy as np

from edge.engines.ort_capi import TELEMETRY_ENV
from edge.preload.fallback import FallbackSpec
from edge.preload.manifest import MANIFEST_NAME, TOKENIZER_FILE, Manifest, ModelPackage, open_package, sha256_file

__all__ = ["QUANTIZE_CHOICES", "INT8_NODES", "MIN_COSINE", "REPORT_FILE", "FALLBACK_DIR", "FallbackMismatch",
           "parity_texts", "quantize_model", "measure", "embed_texts", "fallback_request", "fallback_problem",
           "check_fallback", "embed_fallback"]

QUANTIZE_CHOICES = ("int8",)
INT8_NODES = (  # node names of image/export_model.py's graph (the build fails if one is missing)
    "/embeddings/Gather_1",  # the word-embedding table
    *(f"/layers.{i}/attn_out/MatMul" for i in range(6)),
    *(f"/layers.{i}/qkv/MatMul" for i in range(4)),
    "/layers.0/ffn_in/MatMul", "/layers.5/ffn_in/MatMul",
    *(f"/layers.{i}/ffn_out/MatMul" for i in (3, 4, 5)),
)
OP_TYPES = ("MatMul", "Gather")
EXTRA_OPTIONS = {"MatMulConstBOnly": True}
# 7-bit weights. A CPU with VNNI (x86) or SDOT (a Jetson's Arm cores) sums uint8 x int8 products
# exactly, but an x86 CPU with AVX2 alone multiplies them with VPMADDUBSW, which saturates the sum
# of two products at 16 bits: with full-range weights the same int8 model measured a worst cosine
# of 0.976 on an AVX2-only AMD EPYC build host, against 0.992 on one with VNNI, and the build
# refused it. Reduced-range weights cannot saturate, so the model gives the same figures on every
# host: 0.9916 worst, 0.9968 mean, on the AVX2-only host.
REDUCE_RANGE = True
MIN_COSINE = 0.99  # the fallback's worst cosine with the full model on the parity texts (issue 17)
REPORT_FILE = "quantization.json"  # the build's timings: beside the manifest, in no hash
FALLBACK_DIR = "fallback"
TIMING_SHAPE = (8, 128)  # (rows, tokens): one batch of a mid bucket
TIMING_RUNS = 5  # per model, interleaved, after 2 warm-up calls each
_FP32 = ".fp32"  # the full model's files during the build, inside the staging directory
_PARITY = Path(__file__).resolve().parents[1] / "tests" / "engines" / "sentences.py"

# In a child: the onnxruntime Python binding stays out of the builder, which runs the runtime's
# engine (the C library through ctypes) on the result.
_QUANTIZE = """
import json, logging, sys
import onnx
from onnxruntime.quantization import QuantType, quantize_dynamic
logging.disable(logging.WARNING)  # "consider pre-processing": its shape inference changes nothing here
src, dst, cfg = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
names = {n.name for n in onnx.load(src, load_external_data=False).graph.node}
missing = [n for n in cfg["nodes"] if n not in names]
if missing:
    sys.exit(f"the exported graph has no node {missing[0]} (image/export_model.py changed?): update INT8_NODES")
quantize_dynamic(src, dst, op_types_to_quantize=cfg["op_types"], per_channel=True, reduce_range=cfg["reduce_range"],
                 weight_type=QuantType.QInt8, nodes_to_quantize=cfg["nodes"], extra_options=cfg["extra_options"])
g = onnx.load(dst, load_external_data=False).graph
done = {n.name.removesuffix("_quant") for n in g.node if n.op_type == "MatMulInteger"}
done |= {n.name for n in g.node if n.op_type == "Gather" and n.input[0].endswith("_quantized")}
left = [n for n in cfg["nodes"] if n not in done]
if left:
    sys.exit(f"quantize_dynamic left {len(left)} node(s) in float, e.g. {left[0]}")
"""


class FallbackMismatch(ValueError):
    """The fallback package cannot stand in for this one (another tokenizer, width or length)."""


def parity_texts() -> list[str]:
    """The engines' parity texts (``tests/engines/sentences.py``): a source checkout's, which a build host has."""
    if not _PARITY.is_file():
        raise FileNotFoundError(f"--quantize int8 measures the int8 model on the parity texts of a source checkout "
                                f"({_PARITY} is missing): build from the repository")
    spec = importlib.util.spec_from_file_location("_edge_parity_sentences", _PARITY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.parity_sentences())


def quantize_model(stage: Path, convert_ort, target_platform: str) -> None:
    """Replace ``stage/model.onnx`` (fp32, just exported) by its int8 version; keep the fp32 model,
    in ORT format, in ``stage/.fp32`` for :func:`measure` (which removes it)."""
    full = stage / _FP32
    full.mkdir()
    shutil.move(str(stage / "model.onnx"), full / "model.onnx")
    convert_ort(full / "model.onnx", full / "model.ort", target_platform)
    cfg = {"nodes": list(INT8_NODES), "op_types": list(OP_TYPES), "extra_options": EXTRA_OPTIONS, "reduce_range": REDUCE_RANGE}
    env = {"PATH": "/usr/bin:/bin", "HOME": str(full), "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
           TELEMETRY_ENV: "1"}  # no telemetry from the build host either (edge/engines/ort_capi.py)
    proc = subprocess.run([sys.executable, "-c", _QUANTIZE, str(full / "model.onnx"), str(stage / "model.onnx"),
                           json.dumps(cfg)], capture_output=True, text=True, cwd=full, env=env)
    if proc.returncode != 0 or not (stage / "model.onnx").exists():
        raise RuntimeError(f"int8 quantization failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")


def embed_texts(pkg: ModelPackage, texts: list[str], tokenizer_file: Path, *, rows: int = 32,
                threads: int = 1) -> np.ndarray:
    """(N, D) embeddings of ``texts`` by ``pkg``'s ONNX Runtime engine on the CPU, in batches of one
    bucket (the smallest of the package's buckets that holds a text) of up to ``rows`` texts, in
    order: what the runtime's scheduler forms. Dynamic quantization scales each batch's activations
    together, so the batches are part of the figure."""
    from edge.engines import load_engine
    from edge.preload.tokenizer import Tokenizer

    m = pkg.manifest
    buckets = sorted(m.serving.buckets)
    tokenizer = Tokenizer.open(tokenizer_file)
    engine = load_engine(pkg, "onnxruntime", device="cpu", intra_op_threads=threads)
    try:
        lengths = [len(tokenizer.encode(t, max_length=m.max_seq_length).ids) for t in texts]
        groups: dict[int, list[int]] = {}
        for i, n in enumerate(lengths):
            groups.setdefault(next((b for b in buckets if b >= n), buckets[-1]), []).append(i)
        out = np.zeros((len(texts), m.output_dim), dtype=np.float32)
        for bucket, idx in sorted(groups.items()):
            for s in range(0, len(idx), rows):
                part = idx[s:s + rows]
                batch = tokenizer.encode_batch([texts[i] for i in part], bucket, max_length=m.max_seq_length)
                out[part] = engine.run(batch.input_ids, batch.attention_mask)
    finally:
        engine.close()
        tokenizer.close()
    return out


def _time_pair(full: ModelPackage, int8: ModelPackage, threads: int) -> tuple[float, float]:
    """Median ms per :data:`TIMING_SHAPE` batch of each model, the runs interleaved so that load
    from elsewhere hits both alike."""
    from edge.engines import load_engine

    rows, tokens = TIMING_SHAPE
    rng = np.random.default_rng(0)
    ids = rng.integers(1996, 29000, size=(rows, tokens), dtype=np.int64)  # ordinary word pieces
    ids[:, 0], ids[:, -1] = 101, 102
    mask = np.ones_like(ids)
    engines = [load_engine(p, "onnxruntime", device="cpu", intra_op_threads=threads) for p in (full, int8)]
    samples: list[list[float]] = [[], []]
    try:
        for e in engines:
            e.run(ids, mask), e.run(ids, mask)
        for _ in range(TIMING_RUNS):
            for e, s in zip(engines, samples):
                t = time.perf_counter()
                e.run(ids, mask)
                s.append((time.perf_counter() - t) * 1e3)
    finally:
        for e in engines:
            e.close()
    return float(np.median(samples[0])), float(np.median(samples[1]))


def measure(stage: Path, data: dict) -> tuple[dict, dict]:
    """(the manifest's ``quantization`` block, the timings for :data:`REPORT_FILE`), then the fp32
    files are removed from the staging directory."""
    full_dir = stage / _FP32
    draft = {**data, "package_sha256": "0" * 64}
    int8 = ModelPackage(stage, Manifest.model_validate(draft))
    entry = {"sha256": sha256_file(full_dir / "model.ort"), "size": (full_dir / "model.ort").stat().st_size}
    # The fp32 file in the int8 one's place: its own size and sha256, and no chunks (those are the int8 file's).
    full = ModelPackage(full_dir, Manifest.model_validate({**draft, "files": {**data["files"], "model.ort": entry},
                                                           "sha256_chunks": None}))
    texts = parity_texts()
    a = embed_texts(full, texts, stage / TOKENIZER_FILE)
    b = embed_texts(int8, texts, stage / TOKENIZER_FILE)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    model_bytes, full_bytes = data["files"]["model.ort"]["size"], entry["size"]
    block = {
        "method": "dynamic", "weight_type": "int8", "activation_type": "uint8 (per batch, per tensor)",
        "per_channel": True, "reduce_range": REDUCE_RANGE, "extra_options": EXTRA_OPTIONS,
        "tool": f"onnxruntime.quantization {metadata.version('onnxruntime')}",
        "op_types": list(OP_TYPES), "nodes": list(INT8_NODES),
        "measured": {
            "texts": len(texts), "texts_sha256": sha256("\n".join(texts).encode()).hexdigest(),
            "batches": "by bucket, up to 32 texts", "threads": 1, "file": "model.ort",
            "cosine_min": round(float(cos.min()), 6), "cosine_mean": round(float(cos.mean()), 6),
            "cosine_p1": round(float(np.percentile(cos, 1)), 6), "min_cosine": MIN_COSINE,
            "model_bytes": model_bytes, "full_model_bytes": full_bytes, "size_ratio": round(model_bytes / full_bytes, 4),
            "full_model_sha256": entry["sha256"],
        },
        "timings": REPORT_FILE,
    }
    if cos.min() < MIN_COSINE:
        raise ValueError(f"the int8 model's worst cosine with the full model on the parity texts is {cos.min():.4f}, "
                         f"under {MIN_COSINE} ({texts[int(cos.argmin())][:60]!r}); not writing it")
    threads = 1  # the ratio one core gives; more cores scale both models alike
    full_ms, int8_ms = _time_pair(full, int8, threads)
    shutil.rmtree(full_dir)
    timings = {"shape": list(TIMING_SHAPE), "threads": threads, "runs": TIMING_RUNS, "ms_per_batch": round(int8_ms, 2),
               "full_ms_per_batch": round(full_ms, 2), "speed_ratio": round(int8_ms / full_ms, 3),
               "size_ratio": block["measured"]["size_ratio"], "host": os.uname().machine,
               "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "note": "int8 / full median; not part of the package's identity"}
    return block, timings


# ---------------------------------------------------------------------------------------- fallback


def fallback_request(package: Path | None, engine: str | None, device: str | None) -> dict | None:
    """What the command line asks for: None (no fallback), or {"package", "engine", "device"} with the
    defaults filled in: the fallback package's onnxruntime engine (else its first), on the CPU."""
    if package is None and engine is None and device is None:
        return None
    if engine is None:
        engines = list(open_package(package, verify="none").manifest.engines) if package else ["onnxruntime"]
        engine = "onnxruntime" if "onnxruntime" in engines else engines[0]
    return {"package": None if package is None else Path(package), "engine": engine, "device": device or "cpu"}


def fallback_problem(request: dict, out: Path, engines: list[str]) -> str | None:
    """Why ``request`` cannot be built into the package at ``out`` whose engines are ``engines``
    (None: it can); checked before the minute of work."""
    from edge.errors import PackageError

    package, engine = request["package"], request["engine"]
    if package is None:
        if engine not in engines:
            return (f"--fallback-engine {engine}: this package will have no files for it (it carries "
                    f"{', '.join(engines)}); name a --fallback-package that has them")
        return None
    package = Path(os.path.abspath(package))
    if package == out or out in package.parents or package in out.parents:
        return f"--fallback-package {package} overlaps --out {out}: give a package built elsewhere"
    try:
        pkg = open_package(package, verify="full", engine=engine)
        pkg.engine_files(engine, request["device"])
    except PackageError as exc:
        return f"--fallback-package {package} cannot serve as a fallback on {engine}: {exc}"
    if pkg.manifest.fallback is not None and pkg.manifest.fallback.kind == "package":
        return (f"--fallback-package {package} has a fallback package of its own; a fallback is one level deep: "
                f"give one built without --fallback-package")
    return None


def check_fallback(request: dict | None, tokenizer_fb: bytes | None, output_dim: int, max_seq_length: int) -> None:
    """Raise :class:`FallbackMismatch` when the fallback package cannot take this package's requests:
    the runtime tokenizes them once, with this package's tokenizer, and replies with its width."""
    if not request or request["package"] is None:
        return
    m = open_package(request["package"], verify="none").manifest
    mine = None if tokenizer_fb is None else sha256(tokenizer_fb).hexdigest()
    for what, theirs, ours in (("tokenizer_sha256", m.tokenizer_sha256, mine), ("output_dim", m.output_dim, output_dim),
                               ("max_seq_length", m.max_seq_length, max_seq_length)):
        if theirs != ours:
            raise FallbackMismatch(f"--fallback-package {request['package']}: its {what} is {theirs}, this package's "
                                   f"{ours}; build both from the same source (and --prune-corpus, if any)")


def embed_fallback(stage: Path, request: dict) -> dict:
    """The manifest's ``fallback`` block; for a fallback package, first its copy in ``stage/fallback``
    (its manifest and the files it lists, nothing else), verified in full."""
    if request["package"] is None:
        return FallbackSpec(kind="device", engine=request["engine"], device=request["device"]).to_dict()
    src, dest = Path(request["package"]), stage / FALLBACK_DIR
    names = [MANIFEST_NAME, *open_package(src, verify="none").manifest.files]
    dest.mkdir()
    for name in names:
        shutil.copyfile(src / name, dest / name)
    dest.chmod(0o755)
    pkg = open_package(dest, verify="full")  # the copy, as the device will check it
    return FallbackSpec(kind="package", engine=request["engine"], device=request["device"], path=FALLBACK_DIR,
                        package_sha256=pkg.manifest.package_sha256).to_dict()

