"""Text side of the tokenizer: per-character tables, the ByteLevel split, added tokens.

Everything here reads the tables of the ``.fb`` (see ``tokenizer.fbs``) and keeps
per-character decisions in dicts filled on first use, so the hot path is
``str.translate`` and ``re`` in C. No Unicode database is consulted on the device.
"""

from __future__ import annotations

import re
from bisect import bisect_right

__all__ = ["CharMap", "SplitClasses", "ByteLevelSplitter", "AddedTokenSplitter", "bytes_to_unicode"]

# char_map classes (tokenizer.fbs, table CharTable)
KEEP, REMOVE, SPACE, ISOLATE, MAPPED = 0, 1, 2, 3, 4
# split_classes classes
OTHER, LETTER, NUMBER, U0020, WHITESPACE = 0, 1, 2, 3, 4

# Rust char::is_whitespace, for lstrip/rstrip of added tokens.
_WS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


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

    def split(self, text: str) -> list[str]:
        if self._add_prefix_space and not text.startswith(" "):
            text = " " + text
        cls = text.translate(self._classes)
        return [text[m.start() : m.end()] for m in _SPLIT_RE.finditer(cls)]

    @staticmethod
    def to_byte_chars(piece: str) -> str:
        return piece.encode("utf-8").decode("latin-1").translate(_BYTE_TRANSLATE)


class AddedTokenSplitter:
    """Finds added (special) tokens in raw text, leftmost-longest like the Aho-Corasick
    matcher of ``tokenizers``, and yields text segments and token ids in order."""

    def __init__(self, tokens: list[tuple[int, str, bool, bool]]) -> None:
        # tokens: (id, content, lstrip, rstrip); longest first so alternation is leftmost-longest
        alts = []
        self._ids: dict[str, int] = {}
        for tid, content, lstrip, rstrip in sorted(tokens, key=lambda t: -len(t[1])):
            if not content or content in self._ids:
                continue
            self._ids[content] = tid
            alts.append(
                (f"[{_WS}]*" if lstrip else "") + f"({re.escape(content)})" + (f"[{_WS}]*" if rstrip else "")
            )
        self._re = re.compile("|".join(alts)) if alts else None

    def split(self, text: str) -> list[str | int]:
        """Text segments (str, never empty) and added token ids (int), in order."""
        if self._re is None:
            return [text] if text else []
        out: list[str | int] = []
        pos = 0
        for m in self._re.finditer(text):
            if m.start() > pos:
                out.append(text[pos : m.start()])
            content = next(g for g in m.groups() if g is not None)
            out.append(self._ids[content])
            pos = m.end()
        if pos < len(text):
            out.append(text[pos:])
        return out
