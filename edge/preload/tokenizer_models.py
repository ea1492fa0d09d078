"""Tokenizer models read in place from the ``.fb``: the vocabulary hash, WordPiece, BPE.

Lookups go to the open-addressing tables of the file through memoryviews; nothing
decodes the whole vocabulary at open (WordPiece's first word reads it once, with numpy,
for its bounds). Each model keeps a cache of whole-word results, because real text
repeats its words, bounded in entries and in (approximate) bytes, because an attacker's
words do not repeat.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING
from zlib import crc32

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["VocabTable", "WordPiece", "BPE", "merge_slot", "WORD_CACHE_MAX", "WORD_CACHE_BYTES"]

WORD_CACHE_MAX = 100_000  # words kept per model before the cache is cleared (entries)
# Bytes of cached words and ids per model before the cache is cleared. 9,600 unique long
# words grew the unbounded cache by 306 MB (red-team report); 8 MiB holds ~40,000 typical
# words (about 200 bytes each: str, tuple, ints, dict slot).
WORD_CACHE_BYTES = 8 << 20
_SLOT_BYTES = 64  # dict slot and index per entry, with the table's slack (CPython 3.11: ~21 measured)
_INT_BYTES = 32  # an id above 256 is its own int object: 28 bytes, 32 allocated
_CHAR_IDS_MAX = 65_536  # BPE's character -> id memo (entries, ~10 MB); text can hold 1.1M code points


def merge_slot(left: int, right: int, mask: int) -> int:
    """First slot of a merge pair in ``merge_hash`` (tokenizer.fbs)."""
    return ((left * 0x9E3779B1) ^ (right * 0x85EBCA77)) & mask


class VocabTable:
    """Token string <-> id over ``vocab_blob``/``vocab_offsets``/``vocab_hash``."""

    def __init__(self, blob: memoryview, offsets: memoryview, slots: memoryview) -> None:
        self._blob = blob  # 'B'
        self._offsets = offsets  # 'I', vocab_size + 1
        self._slots = slots  # 'i', power of two
        self._mask = len(slots) - 1

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def get(self, token: str) -> int:
        """Id of ``token``, or -1."""
        return self.get_bytes(token.encode("utf-8"))

    def get_bytes(self, b: bytes) -> int:
        """Id of the UTF-8 token ``b``, or -1."""
        slots, offsets, blob, mask = self._slots, self._offsets, self._blob, self._mask
        h = crc32(b) & mask
        while True:
            i = slots[h]
            if i < 0:
                return -1
            if blob[offsets[i] : offsets[i + 1]] == b:
                return i
            h = (h + 1) & mask

    def longest(self, prefix: bytes = b"") -> int:
        """Bytes of the longest entry that starts with ``prefix``, not counting the prefix
        (-1 when none does): one numpy pass over the offsets and the entries' first bytes
        (~0.3 ms and ~1 MB of temporaries for 30,522 entries, so not at open)."""
        offsets = np.frombuffer(self._offsets, dtype=np.uint32)  # (V + 1,) in place
        starts, lengths = offsets[:-1], np.diff(offsets)  # (V,), (V,)
        keep = lengths >= len(prefix)  # (V,) bool
        if prefix and keep.any():  # then the blob holds at least len(prefix) bytes
            blob = np.frombuffer(self._blob, dtype=np.uint8)
            for k, byte in enumerate(prefix):
                keep &= blob[np.minimum(starts + k, len(blob) - 1)] == byte
        return int(lengths[keep].max()) - len(prefix) if keep.any() else -1

    def alphabet(self) -> tuple[frozenset[str], frozenset[str]]:
        """``(first, inner)``: the characters that begin some entry, and those found after the
        first character of some entry. Numpy over the blob: ~2 ms for 30,522 entries (1,000
        distinct characters), ~2 MB of temporaries."""
        blob = np.frombuffer(self._blob, dtype=np.uint8)  # (B,)
        offsets = np.frombuffer(self._offsets, dtype=np.uint32)  # (V + 1,)
        cps = np.frombuffer(str(self._blob, "utf-8").encode("utf-32-le"), dtype=np.uint32)  # (C,)
        lead = (blob & 0xC0) != 0x80  # (B,) the first byte of a character
        cp_at = np.zeros(len(blob), dtype=np.uint32)  # (B,) code point of the character there
        cp_at[lead] = cps
        starts = offsets[:-1][offsets[1:] > offsets[:-1]]  # (V',) of the non-empty entries
        lead[starts] = False
        return _distinct(cp_at[starts]), _distinct(cp_at[lead])

    def token(self, i: int) -> str:
        return bytes(self._blob[self._offsets[i] : self._offsets[i + 1]]).decode("utf-8")


def _distinct(cps: np.ndarray) -> frozenset[str]:
    """The characters of code points ``cps`` (mostly ASCII: counted, the rest sorted)."""
    low = np.flatnonzero(np.bincount(cps[cps < 256], minlength=256)).tolist()
    high = np.sort(cps[cps >= 256])  # distinct by sort and compare: np.unique imports numpy.ma (7 ms at boot)
    high = high[np.concatenate(([True], high[1:] != high[:-1]))] if high.size else high
    return frozenset(map(chr, low + high.tolist()))


class _WordCache:
    """Memo of word -> ids: real text repeats words, so most lookups skip the model.

    Cleared when full (``WORD_CACHE_MAX`` entries or ``cache_budget`` bytes) rather than
    evicted one by one: cheaper per hit, and a refill costs one model run per distinct word.
    ``cache_bytes`` counts each entry as its str and tuple objects, 32 bytes per id and a
    dict slot: a little over what tracemalloc sees (tests/preload/test_tokenizer_worst_case.py).
    """

    _cache: dict[str, tuple[int, ...]]  # subclasses create it and define _tokenize(word)
    _tokenize: Callable[[str], tuple[int, ...]]  # the model run behind a miss (a subclass's method)
    cache_budget: int  # bytes (approximate) of cached words and ids before a clear
    cache_bytes: int  # bytes (approximate) now held by the cache

    def tokenize(self, word: str) -> tuple[int, ...]:
        ids = self._cache.get(word)
        if ids is None:
            ids = self._tokenize(word)
            size = sys.getsizeof(word) + sys.getsizeof(ids) + _INT_BYTES * len(ids) + _SLOT_BYTES
            if size > self.cache_budget:  # would evict everything else for one word
                return ids
            if len(self._cache) >= WORD_CACHE_MAX or self.cache_bytes + size > self.cache_budget:
                self._cache.clear()
                self.cache_bytes = 0
            self._cache[word] = ids
            self.cache_bytes += size
        return ids


class WordPiece(_WordCache):
    """Greedy longest-match-first, as ``tokenizers``' WordPiece model.

    Two bounds keep a word's cost near its number of pieces (the per-piece lookups):

    * a candidate piece is never longer than the longest vocabulary entry of its kind (first
      pieces: any entry; later pieces: entries with the continuing-subword prefix), in UTF-8
      bytes, which bound characters. Unbounded, a 100-letter word cost up to ~5,000 lookups;
    * a word whose first character begins no entry, or whose later character is in no entry
      after the entry's first character, is [UNK] at once: no piece could cover that
      character. Else such a word ran its ~100 steps before failing on its last character,
      ~0.6 ms for one [UNK] (150 ms per 32 KB text of them).

    Both come from the vocabulary on the first word (``_learn``, ~3 ms), not at open.
    """

    def __init__(
        self, vocab: VocabTable, unk_id: int, prefix: str, max_chars: int, cache_budget: int = WORD_CACHE_BYTES
    ) -> None:
        self._vocab = vocab
        self._unk = unk_id
        self._prefix = prefix.encode("utf-8")
        self._max_chars = max_chars
        self._first_max = -1  # bytes of the longest first piece (_learn)
        self._next_max = -1  # bytes of the longest later piece, prefix excluded (_learn)
        self._first_chars: frozenset[str] | None = None  # characters that begin an entry (_learn)
        self._later_chars: frozenset[str] = frozenset()  # characters a later piece can cover (_learn)
        self._cache: dict[str, tuple[int, ...]] = {}
        self.cache_budget = cache_budget
        self.cache_bytes = 0

    def tokenize(self, word: str) -> tuple[int, ...]:
        if len(word) > self._max_chars:  # counted in characters, as chars().count(); never cached
            return self._unknown()
        return _WordCache.tokenize(self, word)

    def _tokenize(self, word: str) -> tuple[int, ...]:
        if not word:
            return ()
        if len(word) > self._max_chars:
            return self._unknown()
        if self._first_chars is None:
            self._learn()
            assert self._first_chars is not None  # _learn sets it
        if word[0] not in self._first_chars or not self._later_chars.issuperset(word[1:]):
            return self._unknown()
        # VocabTable.get_bytes inlined: ~25% of a miss-heavy word is the call
        vocab, prefix = self._vocab, self._prefix
        slots, offsets, blob, mask = vocab._slots, vocab._offsets, vocab._blob, vocab._mask
        b = word.encode("utf-8")
        n = len(word)
        ascii = len(b) == n  # then character k is byte k
        out = []
        start = 0
        limit = self._first_max
        while start < n:
            end = min(n, start + limit)  # bytes >= characters: longer candidates match no entry
            cur = -1
            while end > start:
                piece = b[start:end] if ascii else word[start:end].encode("utf-8")
                if len(piece) <= limit:  # else longer than any entry: no lookup
                    key = prefix + piece if start else piece
                    h = crc32(key) & mask
                    i = slots[h]
                    while i >= 0 and blob[offsets[i] : offsets[i + 1]] != key:
                        h = (h + 1) & mask
                        i = slots[h]
                    if i >= 0:
                        cur = i
                        break
                end -= 1
            if cur < 0:
                return self._unknown()
            out.append(cur)
            start = end
            limit = self._next_max
        return tuple(out)

    def _learn(self) -> None:
        vocab = self._vocab
        self._first_max, self._next_max = vocab.longest(), vocab.longest(self._prefix)
        first, inner = vocab.alphabet()
        # A character after the first is covered by a piece that starts before it (so it is not
        # the entry's first character), or starts a later piece: after the prefix, when there
        # is one (not the first character either), at an entry's start when there is none.
        self._later_chars = inner if self._prefix else inner | first
        self._first_chars = first

    def _unknown(self) -> tuple[int, ...]:
        if self._unk < 0:
            raise ValueError("WordPiece: word not in the vocabulary and the tokenizer has no unknown token")
        return (self._unk,)


class BPE(_WordCache):
    """Merges by rank (lowest rank first, leftmost among equals), as ``tokenizers``' BPE."""

    def __init__(
        self,
        vocab: VocabTable,
        unk_id: int,
        left: memoryview,
        right: memoryview,
        result: memoryview,
        slots: memoryview,
        fuse_unk: bool,
        ignore_merges: bool,
        cache_budget: int = WORD_CACHE_BYTES,
    ) -> None:
        self._vocab = vocab
        self._unk = unk_id
        self._left, self._right, self._result = left, right, result  # 'i', by rank
        self._slots = slots  # 'i', power of two
        self._mask = len(slots) - 1
        self._fuse_unk = fuse_unk
        self._ignore_merges = ignore_merges
        self._cache: dict[str, tuple[int, ...]] = {}
        self.cache_budget = cache_budget
        self.cache_bytes = 0
        self._char_ids: dict[str, int] = {}

    def rank(self, a: int, b: int) -> int:
        """Rank of the merge of ids ``a`` and ``b``, or -1."""
        slots, mask, left, right = self._slots, self._mask, self._left, self._right
        if mask < 0:
            return -1
        h = merge_slot(a, b, mask)
        while True:
            r = slots[h]
            if r < 0:
                return -1
            if left[r] == a and right[r] == b:
                return r
            h = (h + 1) & mask

    def _tokenize(self, word: str) -> tuple[int, ...]:
        if self._ignore_merges:
            whole = self._vocab.get(word)
            if whole >= 0:
                return (whole,)
        ids: list[int] = []
        last_unknown = False
        char_ids = self._char_ids
        for ch in word:
            i = char_ids.get(ch)
            if i is None:
                if len(char_ids) >= _CHAR_IDS_MAX:
                    char_ids.clear()
                i = char_ids[ch] = self._vocab.get(ch)
            if i >= 0:
                ids.append(i)
                last_unknown = False
            elif self._unk >= 0:
                if not (self._fuse_unk and last_unknown):
                    ids.append(self._unk)
                last_unknown = True
        rank, result = self.rank, self._result
        while len(ids) > 1:
            best, at = -1, -1
            for k in range(len(ids) - 1):
                r = rank(ids[k], ids[k + 1])
                if r >= 0 and (best < 0 or r < best):
                    best, at = r, k
            if best < 0:
                break
            ids[at : at + 2] = (result[best],)
        return tuple(ids)
