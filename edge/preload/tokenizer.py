"""Load the compiled tokenizer (``tokenizer.fb``) in place and encode text.

    tok = Tokenizer.open(path)                      # mmap; microseconds, nothing decoded
    enc = tok.encode("some text")                   # Encoding(.ids with specials, .truncated)
    batch = tok.encode_batch(texts, length=32)      # EncodedBatch, int64 (B, 32) ids and mask

Ids are those of Hugging Face ``tokenizers`` on the tokenizer.json it was compiled
from (``tests/preload/test_tokenizer_parity.py``). Pipeline per text: added tokens
are cut out of the raw text; each other segment goes through the character map
(normalizer, Bert pre-tokenizer classes) and the pre-tokenizer split; each word
through the model (WordPiece or BPE, with a per-word cache); then the post-processor's
prefix and suffix ids and truncation. Imports only numpy and flatbuffers.

With truncation on the right (the serving path), ``encode`` stops once it holds one id
more than fits: the text goes through the pipeline a piece at a time (see ``_ids``), so a
32 KB text costs what its first few hundred tokens cost, not ~1 s (red-team report).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from edge.errors import TokenizerError
from edge.preload.tokenizer_fb import AddedToken as _fb_added  # noqa: F401  imported here, not at first
from edge.preload.tokenizer_fb import CharTable as _fb_table  # noqa: F401  use inside open (see accessors)
from edge.preload.tokenizer_fb.ModelKind import ModelKind
from edge.preload.tokenizer_fb.PreTokenizerKind import PreTokenizerKind
from edge.preload.tokenizer_fb.Tokenizer import Tokenizer as _FbTokenizer
from edge.preload.tokenizer_fb.TruncationSide import TruncationSide
from edge.preload.tokenizer_models import BPE, VocabTable, WordPiece
from edge.preload.tokenizer_text import AddedTokenSplitter, ByteLevelSplitter, CharMap, SplitClasses, _RangeTable

if TYPE_CHECKING:
    from typing import Literal

__all__ = ["load_tokenizer", "Tokenizer", "Encoding", "EncodedBatch", "FORMAT_VERSION", "FILE_IDENTIFIER"]

FORMAT_VERSION = 1
FILE_IDENTIFIER = b"EDTK"

# Characters of a segment mapped per step when encoding stops early; the step doubles up to
# _CHUNK_MAX. 512 characters make ~100 tokens of prose; translate costs ~1 us per 1,000
# ASCII characters and ~50 us per 1,000 others, so overshooting 256 tokens costs little.
_CHUNK_FIRST = 512
_CHUNK_MAX = 8192


def _mapped(seg: str, char_map) -> Iterator[str]:
    """``seg.translate(char_map)`` in pieces. The map works per code point, so the pieces
    join to the translation of the whole, wherever the cuts fall."""
    pos, size, n = 0, _CHUNK_FIRST, len(seg)
    while pos < n:
        piece = seg[pos : pos + size]
        yield piece if char_map is None else piece.translate(char_map)
        pos += size
        size = min(2 * size, _CHUNK_MAX)


@dataclass(slots=True)
class Encoding:
    ids: list[int]  # token ids with the post-processor's specials
    truncated: bool  # tokens were dropped to fit max_length


@dataclass(slots=True)
class EncodedBatch:
    input_ids: np.ndarray  # (B, length) int64, pad_id after the tokens
    attention_mask: np.ndarray  # (B, length) int64, 1 on tokens, 0 on padding
    token_counts: list[int]  # tokens per text, specials included, after truncation
    truncated: list[bool]


def _vec(fb, name: str, fmt: Literal["B", "I", "i"]) -> memoryview | None:
    """Zero-copy memoryview of a vector field of the file (None when absent)."""
    if getattr(fb, name + "IsNone")():
        return None
    arr = getattr(fb, name + "AsNumpy")()  # np.frombuffer over the mapping: no copy
    return memoryview(arr).cast("B").cast(fmt)


def _range_table(ct) -> _RangeTable | None:
    if ct is None:
        return None
    empty = memoryview(b"").cast("I")
    return _RangeTable(
        _vec(ct, "Starts", "I"),
        _vec(ct, "Classes", "B"),
        _vec(ct, "MappedCps", "I") or empty,
        _vec(ct, "MappedOffsets", "I") or memoryview(b"\0\0\0\0").cast("I"),
        _vec(ct, "MappedBlob", "B") or memoryview(b""),
    )


class Tokenizer:
    """A compiled tokenizer read in place from a buffer (normally a read-only mmap)."""

    def __init__(self, buf, *, name: str = "<bytes>", _mapping: mmap.mmap | None = None) -> None:
        self.name = name
        self._mapping = _mapping
        try:
            self._load(buf)
        except TokenizerError:
            raise
        except Exception as e:  # a damaged buffer surfaces as any error of the flatbuffers runtime
            raise TokenizerError(f"{name}: not a valid compiled tokenizer ({type(e).__name__}: {e})") from e

    @classmethod
    def open(cls, path: str | os.PathLike) -> "Tokenizer":
        """Map ``path`` read-only; raises TokenizerError (TOKENIZER_INVALID) naming it."""
        try:
            with open(path, "rb") as f:
                mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise TokenizerError(f"cannot map tokenizer file {os.fspath(path)}: {e}") from e
        return cls(mapping, name=os.fspath(path), _mapping=mapping)

    @classmethod
    def from_bytes(cls, data: bytes) -> "Tokenizer":
        return cls(data)

    def _load(self, buf) -> None:
        if len(buf) < 8 or bytes(buf[4:8]) != FILE_IDENTIFIER:
            raise TokenizerError(f"{self.name}: not a compiled tokenizer (file identifier is not {FILE_IDENTIFIER!r})")
        fb = _FbTokenizer.GetRootAs(buf, 0)
        if fb.FormatVersion() != FORMAT_VERSION:
            raise TokenizerError(f"{self.name}: format version {fb.FormatVersion()}, this runtime reads {FORMAT_VERSION}")
        self._fb = fb
        n = fb.VocabSize()
        blob, offsets, slots = _vec(fb, "VocabBlob", "B"), _vec(fb, "VocabOffsets", "I"), _vec(fb, "VocabHash", "i")
        if blob is None or offsets is None or slots is None or len(offsets) != n + 1 or offsets[n] != len(blob):
            raise TokenizerError(f"{self.name}: vocabulary tables are missing or inconsistent")
        if len(slots) & (len(slots) - 1):
            raise TokenizerError(f"{self.name}: vocabulary hash size {len(slots)} is not a power of two")
        self.vocab = VocabTable(blob, offsets, slots)
        self.unk_id = fb.UnkId()
        if fb.Model() == ModelKind.WordPiece:
            prefix = (fb.ContinuingSubwordPrefix() or b"").decode("utf-8")
            self.model: WordPiece | BPE = WordPiece(self.vocab, self.unk_id, prefix, fb.MaxInputCharsPerWord())
        elif fb.Model() == ModelKind.BPE:
            empty = memoryview(b"").cast("i")
            mh = _vec(fb, "MergeHash", "i") or memoryview(b"\xff\xff\xff\xff").cast("i")
            self.model = BPE(
                self.vocab, self.unk_id, _vec(fb, "MergeLeft", "i") or empty, _vec(fb, "MergeRight", "i") or empty,
                _vec(fb, "MergeResult", "i") or empty, mh, fb.FuseUnk(), fb.IgnoreMerges(),
            )  # fmt: skip
        else:
            raise TokenizerError(f"{self.name}: unknown model kind {fb.Model()}")
        table = _range_table(fb.CharMap())
        self._char_map = CharMap(table) if table is not None else None
        self._byte_level = fb.PreTokenizer() == PreTokenizerKind.ByteLevel
        if self._byte_level:
            classes = _range_table(fb.SplitClasses())
            if classes is None:
                raise TokenizerError(f"{self.name}: ByteLevel pre-tokenizer without split classes")
            self._splitter = ByteLevelSplitter(SplitClasses(classes), fb.AddPrefixSpace())
        self._added_fb = [fb.AddedTokens(i) for i in range(fb.AddedTokensLength())]
        self._added: AddedTokenSplitter | None = None  # built on first encode: a regex compile
        self._prefix = list(_vec(fb, "PrefixIds", "i") or ())
        self._suffix = list(_vec(fb, "SuffixIds", "i") or ())
        side = fb.TruncationSide()
        self._trunc_side = side if side != TruncationSide.None_ else TruncationSide.Right
        self.model_max_length: int | None = fb.TruncationMaxLength() if side != TruncationSide.None_ else None
        self.pad_id: int = fb.PadId()
        self.vocab_size: int = n
        orig = fb.OriginalIdsAsNumpy() if not fb.OriginalIdsIsNone() else None
        self.original_ids: np.ndarray | None = orig  # int32 view in place; new id -> original id
        self.original_vocab_size: int = fb.OriginalVocabSize() or n

    def close(self) -> None:
        """Drop the mapping (views into it become invalid)."""
        self.__dict__.pop("_fb", None)
        if self._mapping is not None:
            try:
                self._mapping.close()
            except BufferError:  # views still exported; the mapping goes with the last of them
                pass
            self._mapping = None

    # -- encoding -------------------------------------------------------------------------

    def token_to_id(self, token: str) -> int | None:
        i = self.vocab.get(token)
        return i if i >= 0 else None

    def id_to_token(self, i: int) -> str:
        return self.vocab.token(i)

    @property
    def num_special_tokens(self) -> int:
        """Ids the post-processor adds to a single text."""
        return len(self._prefix) + len(self._suffix)

    def tokenize(self, text: str) -> list[int]:
        """Ids of ``text`` without the post-processor's specials and without truncation."""
        return self._ids(text, None)

    def prepare(self) -> None:
        """Build now what the first encode would: the added-token pattern and WordPiece's
        bounds (a pass over the vocabulary, ~14 ms here). Boot calls it beside the engine's
        warm-up, so the first request does not pay for it."""
        self._ids("prepare", None)
        learn = getattr(self.model, "_learn", None)
        if learn is not None and getattr(self.model, "_first_chars", True) is None:
            learn()

    def _ids(self, text: str, stop: int | None) -> list[int]:
        """Ids of ``text`` in order, all of them when ``stop`` is None; else the first ids up
        to at least ``stop + 1`` (or all, when fewer): what right truncation to ``stop`` ids
        keeps, and one more to tell that it truncated. Ids come out in text order, so a
        prefix of the ids is all that truncation on the right looks at."""
        if self._added is None:
            self._added = AddedTokenSplitter(
                [(t.Id(), t.Content().decode("utf-8"), t.Lstrip(), t.Rstrip()) for t in self._added_fb]
            )
        ids: list[int] = []
        for seg in self._added.segments(text):
            if isinstance(seg, int):  # an added token's id; else a str (segments yields only these)
                ids.append(seg)
            elif stop is None:
                self._segment(seg, ids)
            elif self._byte_level:
                self._pieces_until(seg, ids, stop)
            else:
                self._words_until(seg, ids, stop)
            if stop is not None and len(ids) > stop:
                break
        return ids

    def _segment(self, seg: str, ids: list[int]) -> None:
        """All ids of a text segment (between added tokens), appended to ``ids``."""
        tokenize = self.model.tokenize
        if self._char_map is not None:
            seg = seg.translate(self._char_map)
        if self._byte_level:
            if not seg:  # all of it removed: no prefix space either, as tokenizers
                return
            to_chars = ByteLevelSplitter.to_byte_chars
            for piece in self._splitter.split(seg):
                ids.extend(tokenize(to_chars(piece)))
        else:
            for word in seg.split(" "):
                if word:
                    ids.extend(tokenize(word))

    def _words_until(self, seg: str, ids: list[int], stop: int) -> None:
        """``_segment`` for the space split, stopping once ``ids`` holds more than ``stop``.
        The mapped text before its last space holds whole words; the text after it may be
        the start of a word that the next piece goes on with."""
        tokenize = self.model.tokenize
        open_word: list[str] = []  # mapped text after the last space so far
        for piece in _mapped(seg, self._char_map):
            cut = piece.rfind(" ")
            if cut < 0:
                open_word.append(piece)
                continue
            open_word.append(piece[:cut])
            words = "".join(open_word).split(" ")
            open_word = [piece[cut + 1 :]]
            for word in filter(None, words):  # filter in C: 32 KB of spaces is 32,768 empty words
                ids.extend(tokenize(word))
                if len(ids) > stop:
                    return
        word = "".join(open_word)
        if word:
            ids.extend(tokenize(word))

    def _pieces_until(self, seg: str, ids: list[int], stop: int) -> None:
        """``_segment`` for the ByteLevel split, stopping once ``ids`` holds more than ``stop``;
        the split is cut where ``ByteLevelSplitter.split_head`` proves it safe."""
        tokenize, to_chars, splitter = self.model.tokenize, ByteLevelSplitter.to_byte_chars, self._splitter
        prefix = splitter.add_prefix_space  # still to decide: on the first character of the mapped text
        rest = ""
        for piece in _mapped(seg, self._char_map):
            if not piece:
                continue
            if prefix:
                prefix = False
                if not piece.startswith(" "):
                    piece = " " + piece
            pieces, rest = splitter.split_head(rest + piece)
            for p in pieces:
                ids.extend(tokenize(to_chars(p)))
                if len(ids) > stop:
                    return
        for p in splitter.pieces(rest):  # "" when all of it was removed
            ids.extend(tokenize(to_chars(p)))

    def _limit(self, max_length: int | None) -> int | None:
        limit = self.model_max_length if max_length is None else max_length
        if limit is not None and limit < self.num_special_tokens:
            raise ValueError(f"max_length {limit} leaves no room for the {self.num_special_tokens} special tokens")
        return limit

    def _finish(self, ids: list[int], limit: int | None) -> Encoding:
        truncated = False
        if limit is not None:
            room = limit - len(self._prefix) - len(self._suffix)
            if len(ids) > room:
                truncated = True
                ids = ids[:room] if self._trunc_side == TruncationSide.Right else ids[len(ids) - room :]
        return Encoding(self._prefix + ids + self._suffix, truncated)

    def _room(self, limit: int | None) -> int | None:
        """Where ``_ids`` may stop: the ids that fit beside the specials when truncation is on
        the right. Left truncation keeps the last ids, so it needs them all (the full path)."""
        if limit is None or self._trunc_side != TruncationSide.Right:
            return None
        return limit - len(self._prefix) - len(self._suffix)

    def encode(self, text: str, max_length: int | None = None) -> Encoding:
        """Ids of one text, with specials. ``max_length`` None: the tokenizer.json's truncation
        (``model_max_length``; no truncation when it had none)."""
        limit = self._limit(max_length)
        return self._finish(self._ids(text, self._room(limit)), limit)

    def encode_batch(self, texts: list[str], length: int, max_length: int | None = None) -> EncodedBatch:
        """Encode and right-pad to ``length`` (a bucket). Texts longer than
        ``min(length, max_length or model_max_length)`` are truncated and flagged."""
        limit = self._limit(max_length)
        limit = length if limit is None else min(limit, length)
        if limit < self.num_special_tokens:
            raise ValueError(f"length {length} leaves no room for the {self.num_special_tokens} special tokens")
        n = len(texts)
        input_ids = np.full((n, length), self.pad_id, dtype=np.int64)  # (B, T)
        mask = np.zeros((n, length), dtype=np.int64)  # (B, T)
        counts: list[int] = []
        truncated: list[bool] = []
        room = self._room(limit)
        for row, text in enumerate(texts):
            enc = self._finish(self._ids(text, room), limit)
            k = len(enc.ids)
            input_ids[row, :k] = enc.ids
            mask[row, :k] = 1
            counts.append(k)
            truncated.append(enc.truncated)
        return EncodedBatch(input_ids, mask, counts, truncated)

    def __repr__(self) -> str:
        kind = "WordPiece" if isinstance(self.model, WordPiece) else "BPE"
        pruned = f", pruned from {self.original_vocab_size}" if self.original_ids is not None else ""
        return f"<Tokenizer {kind} vocab={self.vocab_size}{pruned} {self.name}>"


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Map a compiled tokenizer file (boot's ``load_tokenizer`` stage); raises TokenizerError."""
    return Tokenizer.open(path)
