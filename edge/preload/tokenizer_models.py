"""Tokenizer models read in place from the ``.fb``: the vocabulary hash, WordPiece, BPE.

Lookups go to the open-addressing tables of the file through memoryviews; nothing
decodes the whole vocabulary. Each model keeps a bounded cache of whole-word
results, because real text repeats its words.
"""

from __future__ import annotations

from zlib import crc32

__all__ = ["VocabTable", "WordPiece", "BPE", "merge_slot", "WORD_CACHE_MAX"]

WORD_CACHE_MAX = 100_000  # words kept per model before the cache is cleared (entries)


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
        b = token.encode("utf-8")
        slots, offsets, blob, mask = self._slots, self._offsets, self._blob, self._mask
        h = crc32(b) & mask
        while True:
            i = slots[h]
            if i < 0:
                return -1
            if blob[offsets[i] : offsets[i + 1]] == b:
                return i
            h = (h + 1) & mask

    def token(self, i: int) -> str:
        return bytes(self._blob[self._offsets[i] : self._offsets[i + 1]]).decode("utf-8")


class _WordCache:
    """Memo of word -> ids: real text repeats words, so most lookups skip the model.

    Cleared when full rather than evicted one by one: cheaper per hit, and a
    refill costs one model run per distinct word.
    """

    _cache: dict[str, tuple[int, ...]]  # subclasses create it and define _tokenize(word)

    def tokenize(self, word: str) -> tuple[int, ...]:
        ids = self._cache.get(word)
        if ids is None:
            ids = self._tokenize(word)
            if len(self._cache) >= WORD_CACHE_MAX:
                self._cache.clear()
            self._cache[word] = ids
        return ids


class WordPiece(_WordCache):
    """Greedy longest-match-first, as ``tokenizers``' WordPiece model."""

    def __init__(self, vocab: VocabTable, unk_id: int, prefix: str, max_chars: int) -> None:
        self._vocab = vocab
        self._unk = unk_id
        self._prefix = prefix
        self._max_chars = max_chars
        self._cache: dict[str, tuple[int, ...]] = {}

    def _tokenize(self, word: str) -> tuple[int, ...]:
        if len(word) > self._max_chars:  # counted in characters, as chars().count()
            return self._unknown()
        get, prefix = self._vocab.get, self._prefix
        out = []
        start, n = 0, len(word)
        while start < n:
            end = n
            cur = -1
            while start < end:
                cur = get(prefix + word[start:end] if start else word[start:end])
                if cur >= 0:
                    break
                end -= 1
            if cur < 0:
                return self._unknown()
            out.append(cur)
            start = end
        return tuple(out)

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
    ) -> None:
        self._vocab = vocab
        self._unk = unk_id
        self._left, self._right, self._result = left, right, result  # 'i', by rank
        self._slots = slots  # 'i', power of two
        self._mask = len(slots) - 1
        self._fuse_unk = fuse_unk
        self._ignore_merges = ignore_merges
        self._cache: dict[str, tuple[int, ...]] = {}
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
