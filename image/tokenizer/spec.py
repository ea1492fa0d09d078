"""The compiler's view of a tokenizer, and its writer to the ``.fb`` format.

``TokenizerSpec`` holds what ``edge/preload/tokenizer.fbs`` stores, in plain Python.
``compile.py`` fills one from a tokenizer.json, ``prune.py`` derives a smaller one,
``to_fb`` writes it and ``spec_from_fb`` reads one back (to prune a ``.fb``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from zlib import crc32

import flatbuffers

from edge.preload.tokenizer import FILE_IDENTIFIER, FORMAT_VERSION, Tokenizer
from edge.preload.tokenizer_models import merge_slot
from image.tokenizer.fb_build import AddedToken as fb_added  # the generated builders (image/tokenizer/schema.py)
from image.tokenizer.fb_build import CharTable as fb_table
from image.tokenizer.fb_build import Tokenizer as fb_tok

__all__ = ["CharTableData", "AddedTokenSpec", "TokenizerSpec", "to_fb", "spec_from_fb", "build_char_table"]

MAX_CP = 0x110000


@dataclass
class CharTableData:
    starts: list[int]  # range starts, first 0
    classes: list[int]  # class of each range
    mapped: dict[int, str] = field(default_factory=dict)  # code point -> text (class MAPPED)


def build_char_table(fn) -> CharTableData:
    """Run-length encode ``fn(cp) -> (class, text or None)`` over all code points; a text
    (only for the MAPPED class of a char_map) goes to ``mapped``."""
    starts: list[int] = []
    classes: list[int] = []
    mapped: dict[int, str] = {}
    prev = -1
    for cp in range(MAX_CP):
        k, text = fn(cp)
        if text is not None:  # class MAPPED of a char_map
            mapped[cp] = text
        if k != prev:
            starts.append(cp)
            classes.append(k)
            prev = k
    return CharTableData(starts, classes, mapped)


@dataclass
class AddedTokenSpec:
    id: int
    content: str
    special: bool = True
    lstrip: bool = False
    rstrip: bool = False


@dataclass
class TokenizerSpec:
    model: int  # ModelKind
    pre_tokenizer: int  # PreTokenizerKind
    vocab: list[str]  # token of each id
    unk_id: int = -1
    continuing_subword_prefix: str = ""
    max_input_chars_per_word: int = 100
    merges: list[tuple[int, int, int]] = field(default_factory=list)  # (left, right, result) by rank
    fuse_unk: bool = False
    ignore_merges: bool = False
    add_prefix_space: bool = False
    char_map: CharTableData | None = None
    split_classes: CharTableData | None = None
    added_tokens: list[AddedTokenSpec] = field(default_factory=list)
    prefix_ids: list[int] = field(default_factory=list)
    suffix_ids: list[int] = field(default_factory=list)
    truncation_side: int = 0  # TruncationSide
    truncation_max_length: int = 0
    pad_id: int = 0
    original_ids: list[int] | None = None
    original_vocab_size: int = 0
    source_sha256: str = ""
    description: dict = field(default_factory=dict)


def _pow2_at_least(n: int) -> int:
    size = 1
    while size < n:
        size <<= 1
    return size


def vocab_hash(tokens: list[bytes]) -> list[int]:
    slots = [-1] * _pow2_at_least(max(2 * len(tokens), 2))
    mask = len(slots) - 1
    for i, b in enumerate(tokens):
        h = crc32(b) & mask
        while slots[h] >= 0:
            h = (h + 1) & mask
        slots[h] = i
    return slots


def merge_hash(merges: list[tuple[int, int, int]]) -> list[int]:
    slots = [-1] * _pow2_at_least(max(2 * len(merges), 2))
    mask = len(slots) - 1
    for r, (a, b, _) in enumerate(merges):
        h = merge_slot(a, b, mask)
        while slots[h] >= 0:
            h = (h + 1) & mask
        slots[h] = r
    return slots


def _vector(b: flatbuffers.Builder, values, kind: str) -> int:
    import numpy as np

    dtype = {"u8": np.uint8, "u32": np.uint32, "i32": np.int32}[kind]
    if isinstance(values, bytes):
        return b.CreateNumpyVector(np.frombuffer(values, dtype=np.uint8))
    return b.CreateNumpyVector(np.asarray(values, dtype=dtype))


def _char_table(b: flatbuffers.Builder, t: CharTableData) -> int:
    cps = sorted(t.mapped)
    blobs = [t.mapped[cp].encode("utf-8") for cp in cps]
    offsets = [0]
    for x in blobs:
        offsets.append(offsets[-1] + len(x))
    starts = _vector(b, t.starts, "u32")
    classes = _vector(b, t.classes, "u8")
    mcps = _vector(b, cps, "u32")
    moffs = _vector(b, offsets, "u32")
    mblob = _vector(b, b"".join(blobs), "u8")
    fb_table.Start(b)
    fb_table.AddStarts(b, starts)
    fb_table.AddClasses(b, classes)
    fb_table.AddMappedCps(b, mcps)
    fb_table.AddMappedOffsets(b, moffs)
    fb_table.AddMappedBlob(b, mblob)
    return fb_table.End(b)


def to_fb(spec: TokenizerSpec) -> bytes:
    """Serialize ``spec``; the bytes are a deterministic function of it."""
    b = flatbuffers.Builder(1 << 20)
    tokens = [t.encode("utf-8") for t in spec.vocab]
    offsets = [0]
    for t in tokens:
        offsets.append(offsets[-1] + len(t))
    blob = _vector(b, b"".join(tokens), "u8")
    offs = _vector(b, offsets, "u32")
    vhash = _vector(b, vocab_hash(tokens), "i32")
    prefix = b.CreateString(spec.continuing_subword_prefix)
    vecs = {}
    if spec.merges:
        vecs["left"] = _vector(b, [m[0] for m in spec.merges], "i32")
        vecs["right"] = _vector(b, [m[1] for m in spec.merges], "i32")
        vecs["result"] = _vector(b, [m[2] for m in spec.merges], "i32")
        vecs["mhash"] = _vector(b, merge_hash(spec.merges), "i32")
    char_map = _char_table(b, spec.char_map) if spec.char_map else None
    split = _char_table(b, spec.split_classes) if spec.split_classes else None
    added = []
    for t in spec.added_tokens:
        content = b.CreateString(t.content)
        fb_added.Start(b)
        fb_added.AddId(b, t.id)
        fb_added.AddContent(b, content)
        fb_added.AddSpecial(b, t.special)
        fb_added.AddLstrip(b, t.lstrip)
        fb_added.AddRstrip(b, t.rstrip)
        added.append(fb_added.End(b))
    fb_tok.StartAddedTokensVector(b, len(added))
    for off in reversed(added):
        b.PrependUOffsetTRelative(off)
    added_vec = b.EndVector()
    pre = _vector(b, spec.prefix_ids, "i32")
    suf = _vector(b, spec.suffix_ids, "i32")
    orig = _vector(b, spec.original_ids, "i32") if spec.original_ids is not None else None
    sha = b.CreateString(spec.source_sha256)
    desc = b.CreateString(json.dumps(spec.description, sort_keys=True))

    fb_tok.Start(b)
    fb_tok.AddFormatVersion(b, FORMAT_VERSION)
    fb_tok.AddModel(b, spec.model)
    fb_tok.AddPreTokenizer(b, spec.pre_tokenizer)
    fb_tok.AddVocabSize(b, len(spec.vocab))
    fb_tok.AddVocabBlob(b, blob)
    fb_tok.AddVocabOffsets(b, offs)
    fb_tok.AddVocabHash(b, vhash)
    fb_tok.AddUnkId(b, spec.unk_id)
    fb_tok.AddContinuingSubwordPrefix(b, prefix)
    fb_tok.AddMaxInputCharsPerWord(b, spec.max_input_chars_per_word)
    if spec.merges:
        fb_tok.AddMergeLeft(b, vecs["left"])
        fb_tok.AddMergeRight(b, vecs["right"])
        fb_tok.AddMergeResult(b, vecs["result"])
        fb_tok.AddMergeHash(b, vecs["mhash"])
    fb_tok.AddFuseUnk(b, spec.fuse_unk)
    fb_tok.AddIgnoreMerges(b, spec.ignore_merges)
    fb_tok.AddAddPrefixSpace(b, spec.add_prefix_space)
    if char_map is not None:
        fb_tok.AddCharMap(b, char_map)
    if split is not None:
        fb_tok.AddSplitClasses(b, split)
    fb_tok.AddAddedTokens(b, added_vec)
    fb_tok.AddPrefixIds(b, pre)
    fb_tok.AddSuffixIds(b, suf)
    fb_tok.AddTruncationSide(b, spec.truncation_side)
    fb_tok.AddTruncationMaxLength(b, spec.truncation_max_length)
    fb_tok.AddPadId(b, spec.pad_id)
    if orig is not None:
        fb_tok.AddOriginalIds(b, orig)
    fb_tok.AddOriginalVocabSize(b, spec.original_vocab_size or len(spec.vocab))
    fb_tok.AddSourceSha256(b, sha)
    fb_tok.AddDescription(b, desc)
    root = fb_tok.End(b)
    b.Finish(root, file_identifier=FILE_IDENTIFIER)
    return bytes(b.Output())


def _table_back(ct) -> CharTableData | None:
    if ct is None:
        return None
    cps = [int(x) for x in ct.MappedCpsAsNumpy()] if not ct.MappedCpsIsNone() else []
    offs = [int(x) for x in ct.MappedOffsetsAsNumpy()] if cps else [0]
    blob = bytes(ct.MappedBlobAsNumpy()) if cps else b""
    mapped = {cp: blob[offs[i] : offs[i + 1]].decode("utf-8") for i, cp in enumerate(cps)}
    return CharTableData([int(x) for x in ct.StartsAsNumpy()], [int(x) for x in ct.ClassesAsNumpy()], mapped)


def spec_from_fb(data: bytes) -> TokenizerSpec:
    """Read a ``.fb`` back into a spec (build side; decodes everything)."""
    tok = Tokenizer.from_bytes(data)  # validates
    fb = tok._fb
    ints = lambda name: [int(x) for x in getattr(fb, name + "AsNumpy")()] if not getattr(fb, name + "IsNone")() else []  # noqa: E731
    left, right, result = ints("MergeLeft"), ints("MergeRight"), ints("MergeResult")
    return TokenizerSpec(
        model=fb.Model(),
        pre_tokenizer=fb.PreTokenizer(),
        vocab=[tok.vocab.token(i) for i in range(tok.vocab_size)],
        unk_id=fb.UnkId(),
        continuing_subword_prefix=(fb.ContinuingSubwordPrefix() or b"").decode("utf-8"),
        max_input_chars_per_word=fb.MaxInputCharsPerWord(),
        merges=list(zip(left, right, result)),
        fuse_unk=fb.FuseUnk(),
        ignore_merges=fb.IgnoreMerges(),
        add_prefix_space=fb.AddPrefixSpace(),
        char_map=_table_back(fb.CharMap()),
        split_classes=_table_back(fb.SplitClasses()),
        added_tokens=[
            AddedTokenSpec(t.Id(), t.Content().decode("utf-8"), t.Special(), t.Lstrip(), t.Rstrip())
            for t in (fb.AddedTokens(i) for i in range(fb.AddedTokensLength()))
        ],
        prefix_ids=ints("PrefixIds"),
        suffix_ids=ints("SuffixIds"),
        truncation_side=fb.TruncationSide(),
        truncation_max_length=fb.TruncationMaxLength(),
        pad_id=fb.PadId(),
        original_ids=ints("OriginalIds") if not fb.OriginalIdsIsNone() else None,
        original_vocab_size=fb.OriginalVocabSize(),
        source_sha256=(fb.SourceSha256() or b"").decode("utf-8"),
        description=json.loads((fb.Description() or b"{}").decode("utf-8")),
    )
