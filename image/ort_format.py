"""One byte layout for an ORT-format model: the kernel type string resolver rewritten in a fixed order.

ONNX Runtime's converter writes the model first (tensors, nodes, graph: deterministic) and then
the session's kernel type string resolver, a few KB at the head of the file, whose entries it
creates while iterating a hash map keyed by pointers. The entries' *contents* are the same in
every build and sorted by key, but the order in which their strings and tables were created,
and so their offsets, follows the heap's addresses: a different venv path, thread count or CPU
set moves ~1.5 KB of bytes and changes the file's digest.

:func:`canonical_ort` keeps every byte from the model's first object to the end of the file and
rebuilds only what comes before it (the root table and the resolver) from the decoded contents,
in one fixed order, with the Python FlatBuffers builder. The model stays where it was, counted
from the end of the file, so its offsets and alignment stay valid; ONNX Runtime reads the
resolver into a map, so the order it was created in carries no meaning.
"""

from __future__ import annotations

import struct

import flatbuffers
from onnxruntime.tools.ort_format_model.ort_flatbuffers_py.fbs import (
    ArgTypeAndIndex,
    InferenceSession,
    KernelTypeStrArgsEntry,
    KernelTypeStrResolver,
    OpIdKernelTypeStrArgsEntry,
)

__all__ = ["OrtLayoutError", "canonical_ort", "resolver_entries"]

FILE_IDENTIFIER = b"ORTM"
# InferenceSession's fields as vtable slots (byte offsets in the vtable): ort_version, model,
# session_state (deprecated, never written since ORT 1.13), kernel_type_str_resolver.
_SESSION_SLOTS = {4: "ort_version", 6: "model", 8: "session_state", 10: "kernel_type_str_resolver"}
# The canonical file's length is a multiple of this. FlatBuffers aligns from the end of the
# buffer, so the kept model's fields stay aligned as long as the file's length is a multiple of
# the largest alignment they need (the converter's own minalign, well under a page). A constant,
# not a figure read from the input: the converter's file length varies with its head's layout, and
# an alignment derived from it (the largest power of two dividing it) made two builds differ by
# 8 bytes of padding whenever one raw length happened to be a multiple of 16 and the other not.
FILE_ALIGN = 4096

Entries = list[tuple[bytes, list[tuple[bytes, list[tuple[int, int]]]]]]


class OrtLayoutError(ValueError):
    """The file is not laid out as the converter writes it; it is left as it is, and says why."""


def resolver_entries(data: bytes) -> Entries:
    """The resolver's contents: (op id, [(kernel type string, [(arg type, index)])]) in file order."""
    resolver = _session(data).KernelTypeStrResolver()
    if resolver is None:
        raise OrtLayoutError("the session has no kernel type string resolver")
    out: Entries = []
    for i in range(resolver.OpKernelTypeStrArgsLength()):
        op = resolver.OpKernelTypeStrArgs(i)
        kinds = []
        for j in range(op.KernelTypeStrArgsLength()):
            kind = op.KernelTypeStrArgs(j)
            args = [(kind.Args(k).ArgType(), kind.Args(k).Index()) for k in range(kind.ArgsLength())]
            kinds.append((kind.KernelTypeStr(), args))
        out.append((op.OpId(), kinds))
    return out


def canonical_ort(data: bytes) -> bytes:
    """``data`` with its head (root table and resolver) rebuilt in one order; the model's bytes kept."""
    session = _session(data)
    _only_known_fields(data, session._tab.Pos)
    model, version = session.Model(), _string_pos(data, session._tab, 4)
    if model is None or version is None:
        raise OrtLayoutError("the session lacks its model or its ORT version")
    keep_from = min(model._tab.Pos, _vtable_pos(data, model._tab.Pos), version)
    if keep_from <= session._tab.Pos:
        raise OrtLayoutError("the model does not follow the session's head")
    kept = data[keep_from:]
    builder = flatbuffers.Builder(0)
    # Start the builder with the kept bytes already written at its end: every offset the builder
    # hands out is counted from the end of the buffer, so the kept bytes' offsets stay valid.
    room = 16384
    builder.Bytes = bytearray(room) + kept
    builder.head = flatbuffers.number_types.UOffsetTFlags.py_type(room)
    builder.minalign = FILE_ALIGN
    resolver = _write_resolver(builder, resolver_entries(data))
    InferenceSession.Start(builder)
    InferenceSession.AddOrtVersion(builder, len(data) - version)
    InferenceSession.AddModel(builder, len(data) - model._tab.Pos)
    InferenceSession.AddKernelTypeStrResolver(builder, resolver)
    builder.Finish(InferenceSession.End(builder), file_identifier=FILE_IDENTIFIER)
    out = bytes(builder.Output())
    if not out.endswith(kept) or resolver_entries(out) != resolver_entries(data):
        raise OrtLayoutError("the rebuilt file does not keep the model or the resolver's contents")
    return out


def _session(data: bytes) -> InferenceSession.InferenceSession:
    if len(data) < 8 or data[4:8] != FILE_IDENTIFIER:
        raise OrtLayoutError(f"not an ORT-format model (identifier {data[4:8]!r}, expected {FILE_IDENTIFIER!r})")
    return InferenceSession.InferenceSession.GetRootAs(data, 0)


def _vtable_pos(data: bytes, table_pos: int) -> int:
    return table_pos - struct.unpack_from("<i", data, table_pos)[0]


def _only_known_fields(data: bytes, table_pos: int) -> None:
    """The session carries only the three fields this module rewrites (no deprecated state)."""
    vt = _vtable_pos(data, table_pos)
    vt_len = struct.unpack_from("<H", data, vt)[0]
    present = {slot for slot in range(4, vt_len, 2) if struct.unpack_from("<H", data, vt + slot)[0]}
    unknown = present - {4, 6, 10}
    if unknown:
        names = ", ".join(_SESSION_SLOTS.get(s, f"slot {s}") for s in sorted(unknown))
        raise OrtLayoutError(f"the session carries fields this rewrite does not know: {names}")


def _string_pos(data: bytes, tab: flatbuffers.table.Table, slot: int) -> int | None:
    """Where the string in ``slot`` of a table starts (its length prefix), or None."""
    o = tab.Offset(slot)
    if not o:
        return None
    field = tab.Pos + o
    return field + struct.unpack_from("<I", data, field)[0]



def _write_resolver(builder: flatbuffers.Builder, entries: Entries) -> int:
    """The resolver's tables, innermost first, entry by entry in the (sorted) order given."""
    ops = []
    for op_id, kinds in entries:
        kind_offsets = []
        for kind, args in kinds:
            arg_offsets = []
            for arg_type, index in args:
                ArgTypeAndIndex.Start(builder)
                ArgTypeAndIndex.AddArgType(builder, arg_type)
                ArgTypeAndIndex.AddIndex(builder, index)
                arg_offsets.append(ArgTypeAndIndex.End(builder))
            args_vec = _vector(builder, arg_offsets)
            name = builder.CreateString(kind)
            KernelTypeStrArgsEntry.Start(builder)
            KernelTypeStrArgsEntry.AddKernelTypeStr(builder, name)
            KernelTypeStrArgsEntry.AddArgs(builder, args_vec)
            kind_offsets.append(KernelTypeStrArgsEntry.End(builder))
        kinds_vec = _vector(builder, kind_offsets)
        op_name = builder.CreateString(op_id)
        OpIdKernelTypeStrArgsEntry.Start(builder)
        OpIdKernelTypeStrArgsEntry.AddOpId(builder, op_name)
        OpIdKernelTypeStrArgsEntry.AddKernelTypeStrArgs(builder, kinds_vec)
        ops.append(OpIdKernelTypeStrArgsEntry.End(builder))
    ops_vec = _vector(builder, ops)
    KernelTypeStrResolver.Start(builder)
    KernelTypeStrResolver.AddOpKernelTypeStrArgs(builder, ops_vec)
    return KernelTypeStrResolver.End(builder)


def _vector(builder: flatbuffers.Builder, offsets: list[int]) -> int:
    builder.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        builder.PrependUOffsetTRelative(off)
    return builder.EndVector()
