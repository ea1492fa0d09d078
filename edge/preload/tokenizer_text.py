"""Text side of the tokenizer: per-character tables, the ByteLevel split, added tokens.

Everything here reads the tables of the ``.fb`` (see ``tokenizer.fbs``) and keeps
per-character decisions in dicts filled on first use, so the hot path is
``str.translate`` and ``re`` in C. No Unicode database is consulted on the device.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterator

__all__ = ["CharMap", "SplitClasses", "ByteLevelSplitter", "AddedTokenSplitter", "bytes_to_unicode"]

# char_map classes (tokenizer.fbs, table CharTable)
KEEP, REMOVE, SPACE, ISOLATE, MAPPED = 0, 1, 2, 3, 4
# split_classes classes
OTHER, LETTER, NUMBER, U0020, WHITESPACE = 0, 1, 2, 3, 4

# Entries of a per-code-point memo before it is cleared: a text can show 32,768 new code
# points and Unicode has 1.1M, ~150 bytes each as dict entries; 65,536 is ~10 MB.
CHAR_MEMO_MAX = 65_536

# Rust char::is_whitespace, for lstrip/rstrip of added tokens.
_WS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_WS_CHARS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000" + "".join(map(chr, range(0x2000, 0x200B)))
_WS_RUN = re.compile(f"[{_WS}]*")
_IS_WS = re.compile(f"[{_WS}]")


class _RangeTable:
    """A CharTable read in place: class of a code point by bisection over range starts."""

    def __init__(self, starts, classes, mapped_cps, mapped_offsets, mapped_blob) -> None:
        self.starts = starts  # memoryview 'I'
        self.classes = classes  # memoryview 'B'
        self.mapped_cps = mapped_cps
        self.mapped_offsets = mapped_offsets
        self.mapped_blob = mapped_blob

    def klass(self, cp: int) -> int:
        return self.classes[bisect_right(self.starts, cp) - 1]

    def mapped(self, cp: int) -> str:
        i = bisect_right(self.mapped_cps, cp) - 1
        if i < 0 or self.mapped_cps[i] != cp:
            raise KeyError(cp)
        o = self.mapped_offsets
        return bytes(self.mapped_blob[o[i] : o[i + 1]]).decode("utf-8")


class CharMap(dict):
    """``str.translate`` table of normalizer (+ Bert pre-tokenizer) output per code point.

    Filled on first sight of each code point; CPython's translate calls ``__missing__``
    through ``dict.__getitem__``.
    """

    def __init__(self, table: _RangeTable) -> None:
        super().__init__()
        self._table = table

    def __missing__(self, cp: int):
        if len(self) >= CHAR_MEMO_MAX:  # safe inside translate: it only looks entries up
            self.clear()
        k = self._table.klass(cp)
        if k == KEEP:
            out = chr(cp)
        elif k == REMOVE:
            out = None
        elif k == SPACE:
            out = " "
        elif k == ISOLATE:
            out = f" {chr(cp)} "
        else:
            out = self._table.mapped(cp)
        self[cp] = out
        return out


class SplitClasses(dict):
    """``str.translate`` table from a character to its one-character class for the split
    pattern: ``L`` letter, ``N`` number, `` `` U+0020, ``w`` other whitespace, ``o`` other;
    the apostrophe and the ASCII letters of the contractions stand for themselves."""

    _CLASS_CHAR = {OTHER: "o", LETTER: "L", NUMBER: "N", U0020: " ", WHITESPACE: "w"}

    def __init__(self, table: _RangeTable) -> None:
        super().__init__()
        self._table = table

    def __missing__(self, cp: int) -> str:
        if len(self) >= CHAR_MEMO_MAX:
            self.clear()
        k = self._table.klass(cp)
        out = self._CLASS_CHAR[k]
        if cp == 0x27:  # '
            out = "'"
        elif k == LETTER and chr(cp) in "strevmld":
            out = chr(cp)
        self[cp] = out
        return out


# GPT-2's  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
# over the class string (one class character per text character, so spans carry over).
_SPLIT_RE = re.compile(r"'(?:s|t|re|ve|m|ll|d)| ?[Lstrevmld]+| ?N+| ?[o']+|[ w]+(?![^ w])|[ w]+")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


# latin-1 code point (= byte value) -> printable character
_BYTE_TRANSLATE = {b: c for b, c in bytes_to_unicode().items()}


class ByteLevelSplitter:
    """ByteLevel pre-tokenizer: split with the GPT-2 pattern, map bytes to characters."""

    def __init__(self, classes: SplitClasses, add_prefix_space: bool) -> None:
        self._classes = classes
        self._add_prefix_space = add_prefix_space

    @property
    def add_prefix_space(self) -> bool:
        return self._add_prefix_space

    def split(self, text: str) -> list[str]:
        if self._add_prefix_space and not text.startswith(" "):
            text = " " + text
        return self.pieces(text)

    def pieces(self, text: str) -> list[str]:
        """The split of ``text`` as it is (no prefix space added)."""
        cls = text.translate(self._classes)
        return [text[m.start() : m.end()] for m in _SPLIT_RE.finditer(cls)]

    def split_head(self, text: str) -> tuple[list[str], str]:
        """``(pieces, rest)``: the pieces of the longest head of ``text`` whose split cannot
        change with what follows ``text``, and the rest, to go before what follows.

        The head ends where a whitespace run follows a non-whitespace character: no
        alternative of the pattern goes on from a non-space into a space (a space only opens
        a match or is all of it), and no alternative looks behind, so the split of
        ``head + anything`` is the split of the head followed by that of ``anything``.
        """
        cls = text.translate(self._classes)
        head = cls.rstrip(" w")
        if len(head) == len(cls):  # ends inside a word: back up to the last whitespace run
            k = max(cls.rfind(" "), cls.rfind("w"))
            if k < 0:
                return [], text
            head = cls[:k].rstrip(" w")
        cut = len(head)
        if cut == 0:
            return [], text
        return [text[m.start() : m.end()] for m in _SPLIT_RE.finditer(cls, 0, cut)], text[cut:]

    @staticmethod
    def to_byte_chars(piece: str) -> str:
        return piece.encode("utf-8").decode("latin-1").translate(_BYTE_TRANSLATE)


class AddedTokenSplitter:
    """Finds added (special) tokens in raw text, leftmost-longest like the Aho-Corasick
    matcher of ``tokenizers``, and yields text segments and token ids in order.

    The pattern is one alternation of the contents without groups, so ``re`` skips to their
    first characters: ~0.01 ms over 32 KB, where a group per token made it try every
    position (~2 ms). Whitespace that an lstrip/rstrip token absorbs is found around each
    match, as ``tokenizers`` does; inside the pattern (``[ws]*(token)``) it cost O(n^2) on
    a long whitespace run, and where an lstrip token's content began a longer token's
    (" abc", "ab" lstrip, "abc") it took "ab" from the space where tokenizers takes "abc".
    Contents that begin or end with whitespace keep that pattern (whitespace and groups).
    """

    def __init__(self, tokens: list[tuple[int, str, bool, bool]]) -> None:
        # tokens: (id, content, lstrip, rstrip); longest first so alternation is leftmost-longest
        alts, grouped = [], []
        self._ids: dict[str, int] = {}
        self._lstrip: set[str] = set()  # contents that absorb the whitespace before them
        self._rstrip: set[str] = set()  # ... and after them
        for tid, content, lstrip, rstrip in sorted(tokens, key=lambda t: -len(t[1])):
            if not content or content in self._ids:
                continue
            self._ids[content] = tid
            if lstrip:
                self._lstrip.add(content)
            if rstrip:
                self._rstrip.add(content)
            alts.append(re.escape(content))
            grouped.append(
                (f"[{_WS}]*" if lstrip else "") + f"({re.escape(content)})" + (f"[{_WS}]*" if rstrip else "")
            )
        self._re = re.compile("|".join(alts)) if alts else None
        spaced = any(_IS_WS.match(c[0]) or _IS_WS.match(c[-1]) for c in self._ids)
        self._grouped = re.compile("|".join(grouped)) if spaced and (self._lstrip or self._rstrip) else None

    def split(self, text: str) -> list[str | int]:
        """Text segments (str, never empty) and added token ids (int), in order."""
        return list(self.segments(text))

    def segments(self, text: str) -> Iterator[str | int]:
        """``split`` one item at a time: a caller that stops early scans no further."""
        if self._re is None:
            if text:
                yield text
            return
        if self._grouped is not None:
            yield from self._segments_grouped(text)
            return
        search, lstrip, rstrip, ids = self._re.search, self._lstrip, self._rstrip, self._ids
        pos = 0
        while (m := search(text, pos)) is not None:
            content, start, end = m.group(), m.start(), m.end()
            if content in lstrip:  # back over whitespace, not into the previous match
                start = pos + len(text[pos:start].rstrip(_WS_CHARS))
            if content in rstrip:
                ws = _WS_RUN.match(text, end)
                assert ws is not None  # a run of zero or more: matches anywhere
                end = ws.end()
            if start > pos:
                yield text[pos:start]
            yield ids[content]
            pos = end
        if pos < len(text):
            yield text[pos:]

    def _segments_grouped(self, text: str) -> Iterator[str | int]:
        assert self._grouped is not None  # the caller's check: only called with a grouped pattern
        pos = 0
        for m in self._grouped.finditer(text):
            if m.start() > pos:
                yield text[pos : m.start()]
            content = next(g for g in m.groups() if g is not None)
            yield self._ids[content]
            pos = m.end()
        if pos < len(text):
            yield text[pos:]
