"""image/ort_format.py: the ORT converter's output in one byte layout, whatever the heap did.

The converter's raw output differs from run to run (its resolver's layout follows heap
addresses); the package ships the canonical file. These tests convert for real, in other
conditions than the package build's (ASLR on, one CPU, the other platform), and build a variant
whose resolver was created in the reverse order, and check that each comes back to the bytes the
package ships, and that ONNX Runtime computes the same embeddings from the rewritten file.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import flatbuffers
import numpy as np
import onnxruntime as ort
import pytest
from onnxruntime.tools.ort_format_model.ort_flatbuffers_py.fbs import (
    ArgTypeAndIndex,
    InferenceSession,
    KernelTypeStrArgsEntry,
    KernelTypeStrResolver,
    OpIdKernelTypeStrArgsEntry,
)

from image import ort_format as F

pytestmark = pytest.mark.process


def _raw_conversion(onnx_path, out_dir, platform: str, cpus: set[int]) -> bytes:
    """onnxruntime's converter as a user would run it: no pinned layout, on the CPUs given."""
    out_dir.mkdir()
    subprocess.run([sys.executable, "-m", "onnxruntime.tools.convert_onnx_models_to_ort", str(onnx_path),
                    "--output_dir", str(out_dir), "--optimization_style", "Fixed", "--target_platform", platform],
                   check=True, capture_output=True, timeout=300, preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    return (out_dir / "model.ort").read_bytes()


def _reversed_head(data: bytes, minalign: int = F.FILE_ALIGN, slack: int = 0) -> bytes:
    """The same file with its resolver's tables created last-entry-first: another layout of one
    content. ``minalign`` and ``slack`` (unreferenced bytes in the head) vary the file's length
    as the converter's heap does."""
    session = InferenceSession.InferenceSession.GetRootAs(data, 0)
    model = session.Model()._tab.Pos
    keep_from = min(model, F._vtable_pos(data, model))
    version = F._string_pos(data, session._tab, 4)
    b = flatbuffers.Builder(0)
    b.Bytes, b.head, b.minalign = bytearray(16384) + data[keep_from:], 16384, minalign
    if slack:
        b.CreateByteVector(bytes(slack))
    made = []
    for op_id, kinds in reversed(F.resolver_entries(data)):
        kind_offsets = []
        for kind, args in kinds:
            name = b.CreateString(kind)  # the string first, then the args: the other way round
            arg_offsets = []
            for arg_type, index in args:
                ArgTypeAndIndex.Start(b)
                ArgTypeAndIndex.AddArgType(b, arg_type)
                ArgTypeAndIndex.AddIndex(b, index)
                arg_offsets.append(ArgTypeAndIndex.End(b))
            vec = F._vector(b, arg_offsets)
            KernelTypeStrArgsEntry.Start(b)
            KernelTypeStrArgsEntry.AddKernelTypeStr(b, name)
            KernelTypeStrArgsEntry.AddArgs(b, vec)
            kind_offsets.append(KernelTypeStrArgsEntry.End(b))
        vec = F._vector(b, kind_offsets)
        op_name = b.CreateString(op_id)
        OpIdKernelTypeStrArgsEntry.Start(b)
        OpIdKernelTypeStrArgsEntry.AddOpId(b, op_name)
        OpIdKernelTypeStrArgsEntry.AddKernelTypeStrArgs(b, vec)
        made.append(OpIdKernelTypeStrArgsEntry.End(b))
    ops = F._vector(b, list(reversed(made)))  # the vector itself stays in key order
    KernelTypeStrResolver.Start(b)
    KernelTypeStrResolver.AddOpKernelTypeStrArgs(b, ops)
    resolver = KernelTypeStrResolver.End(b)
    InferenceSession.Start(b)
    InferenceSession.AddOrtVersion(b, len(data) - version)
    InferenceSession.AddModel(b, len(data) - model)
    InferenceSession.AddKernelTypeStrResolver(b, resolver)
    b.Finish(InferenceSession.End(b), file_identifier=F.FILE_IDENTIFIER)
    return bytes(b.Output())


def _embed(model: bytes) -> np.ndarray:
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    ids = np.array([[101, 7592, 2088, 2003, 1037, 3231, 102, 0]], dtype=np.int64)
    feeds = dict(zip([i.name for i in session.get_inputs()], [ids, (ids > 0).astype(np.int64)]))
    return session.run(None, feeds)[0]


def test_other_conversions_come_back_to_the_shipped_bytes(minilm_package, tmp_path):
    shipped = (minilm_package / "model.ort").read_bytes()
    assert F.canonical_ort(shipped) == shipped  # the package ships the canonical layout
    raws = [_raw_conversion(minilm_package / "model.onnx", tmp_path / "arm-all", "arm", os.sched_getaffinity(0)),
            _raw_conversion(minilm_package / "model.onnx", tmp_path / "amd64-one", "amd64", {min(os.sched_getaffinity(0))})]
    variants = [*raws, _reversed_head(shipped)]
    assert variants[-1] != shipped and F.resolver_entries(variants[-1]) == F.resolver_entries(shipped)
    digests = {hashlib.sha256(v).hexdigest()[:12] for v in variants}
    print(f"[ort layout] {len(digests)} raw layouts of {len(variants)} -> the shipped one")
    for v in variants:
        assert F.canonical_ort(v) == shipped
    assert np.array_equal(_embed(shipped), _embed(raws[0]))


def test_the_raw_files_length_does_not_reach_the_canonical_one(minilm_package):
    """Raw heads whose lengths differ by 8 bytes at a time (some a multiple of 16, some not) give
    one file: the canonical padding is a constant, not read from the raw file's length (CI saw two
    int8 builds 8 bytes apart when it was)."""
    shipped = (minilm_package / "model.ort").read_bytes()
    assert len(shipped) % F.FILE_ALIGN == 0
    variants = [_reversed_head(shipped, minalign=8, slack=slack) for slack in (0, 4, 8, 12, 16, 20)]
    lengths = {len(v) for v in variants}
    assert len({n & -n for n in lengths}) > 1, lengths  # the lengths' largest power-of-two factors differ
    for v in variants:
        assert F.canonical_ort(v) == shipped


def test_anything_else_is_refused_with_the_reason():
    with pytest.raises(F.OrtLayoutError, match="not an ORT-format model"):
        F.canonical_ort(b"\x08\x00\x00\x00ONNX" + bytes(64))
