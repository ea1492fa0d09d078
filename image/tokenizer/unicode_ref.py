"""Character properties as Hugging Face ``tokenizers`` sees them, for the compiler.

The compiler bakes every per-character decision into the ``.fb`` (see
``edge/preload/tokenizer.fbs``), so the device needs no Unicode tables. The
decisions come from Python's ``unicodedata`` plus the overrides in
``unicode_overrides.json``: the code points where the Rust crates behind
``tokenizers`` use another Unicode version than this Python. Measured with
tokenizers 0.23 against unicodedata 14.0 (Python 3.11), they are:

* ``unicode_categories`` (BertNormalizer clean_text / strip_accents, BertPreTokenizer
  punctuation) has older tables: about 400 marks and format characters assigned
  after Unicode 9 are not Mn / Cf for it, so it keeps them;
* Rust's ``char::to_lowercase`` is newer: it lowercases letters that are still
  unassigned in unicodedata 14.0 (e.g. U+A7CB);
* onig (the ByteLevel split pattern) has its own tables for \\p{L}, \\p{N}, \\s.

``python -m image.tokenizer.unicode_ref --regenerate`` measures them again with
the installed ``tokenizers`` (a test/dev dependency, never needed to compile).
The compiler refuses to run under a Python whose ``unicodedata`` version the
overrides were not measured for, rather than produce a table that may differ.
"""

from __future__ import annotations

import json
import sys
import unicodedata
from functools import lru_cache
from pathlib import Path

from edge.errors import ErrorCode, TokenizerError

OVERRIDES_PATH = Path(__file__).with_name("unicode_overrides.json")
MAX_CP = 0x110000

# Rust char::is_whitespace (the Unicode White_Space property; stable since Unicode 4.1).
WHITESPACE = frozenset(
    [0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029]
    + [0x202F, 0x205F, 0x3000]
)
# BertNormalizer::is_chinese_char
CHINESE_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)  # fmt: skip


def is_chinese(cp: int) -> bool:
    return any(a <= cp <= b for a, b in CHINESE_RANGES)


def _is_surrogate(cp: int) -> bool:
    return 0xD800 <= cp <= 0xDFFF


@lru_cache(maxsize=1)
def overrides() -> dict:
    data = json.loads(OVERRIDES_PATH.read_text(encoding="utf-8"))
    if data["unidata_version"] != unicodedata.unidata_version:
        raise TokenizerError(
            f"unicode_overrides.json was measured for unicodedata {data['unidata_version']}, "
            f"this Python has {unicodedata.unidata_version}; run "
            "'python -m image.tokenizer.unicode_ref --regenerate' with tokenizers installed",
            ErrorCode.TOKENIZER_UNSUPPORTED,
        )
    return {
        "other_add": set(data["other_add"]),
        "other_remove": set(data["other_remove"]),
        "strip_accents": {int(k): v for k, v in data["strip_accents"].items()},
        "lowercase": {int(k): v for k, v in data["lowercase"].items()},
        "bert_class": {int(k): v for k, v in data["bert_class"].items()},
        "byte_level_class": {int(k): v for k, v in data["byte_level_class"].items()},
    }


def overrides_meta() -> dict:
    """Which versions the overrides were measured with (recorded in each .fb)."""
    data = json.loads(OVERRIDES_PATH.read_text(encoding="utf-8"))
    return {"unidata_version": data["unidata_version"], "tokenizers_version": data["tokenizers_version"]}


@lru_cache(maxsize=1)
def overridden_code_points() -> frozenset[int]:
    o = overrides()
    return frozenset().union(*(set(v) for v in o.values()))


# -- properties straight from unicodedata (what the overrides correct) --------------------


def py_is_other(cp: int) -> bool:
    return unicodedata.category(chr(cp)) in ("Cc", "Cf", "Co", "Cs")


def py_strip_accents(s: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFD", s) if unicodedata.category(c) != "Mn")


def py_lower(s: str) -> str:
    # Per character, as NormalizedString::lowercase: no final-sigma context.
    return "".join(c.lower() for c in s)


def py_bert_class(cp: int) -> str:
    if cp in WHITESPACE:
        return "space"
    c = chr(cp)
    if (0x21 <= cp <= 0x7E and not c.isalnum()) or unicodedata.category(c).startswith("P"):
        return "punct"
    return "word"


def py_byte_level_class(cp: int) -> str:
    if cp in WHITESPACE:  # onig's \s: White_Space (not Python's isspace, which adds U+001C..U+001F)
        return "S"
    cat = unicodedata.category(chr(cp))
    return {"L": "L", "N": "N"}.get(cat[0], "O")


# -- the reference's view: unicodedata corrected by the overrides -------------------------


def is_other(cp: int) -> bool:
    o = overrides()
    if cp in o["other_add"]:
        return True
    if cp in o["other_remove"]:
        return False
    return py_is_other(cp)


def strip_accents_char(c: str) -> str:
    o = overrides()["strip_accents"]
    return o[ord(c)] if ord(c) in o else py_strip_accents(c)  # "" (removed) is a valid override


def lower_char(c: str) -> str:
    o = overrides()["lowercase"]
    return o[ord(c)] if ord(c) in o else py_lower(c)


def bert_class(cp: int) -> str:
    o = overrides()["bert_class"]
    return o[cp] if cp in o else py_bert_class(cp)


def byte_level_class(cp: int) -> str:
    o = overrides()["byte_level_class"]
    return o[cp] if cp in o else py_byte_level_class(cp)


def bert_char(
    cp: int, *, clean_text: bool, chinese: bool, strip_accents: bool, lowercase: bool, isolate: bool = True
) -> str:
    """What BertNormalizer (with these flags) then BertPreTokenizer (``isolate``) make of one
    character. Whitespace becomes " ", punctuation " c ", so the words are ``out.split(" ")``.
    """
    c = chr(cp)
    if clean_text:
        if cp == 0 or cp == 0xFFFD or (c not in "\t\n\r" and is_other(cp)):
            return ""
        if cp in WHITESPACE:
            return " "
    out = f" {c} " if chinese and is_chinese(cp) else c
    if strip_accents:
        out = "".join(strip_accents_char(ch) if ch != " " else ch for ch in out)
    if lowercase:
        out = "".join(lower_char(ch) for ch in out)
    if not isolate:
        return out
    parts = []
    for ch in out:
        k = bert_class(ord(ch))
        parts.append(" " if k == "space" else f" {ch} " if k == "punct" else ch)
    return "".join(parts)


# -- measuring the overrides against tokenizers ---------------------------------------------


def _measure() -> dict:  # pragma: no cover - run by hand, needs tokenizers
    import tokenizers
    from tokenizers import normalizers, pre_tokenizers

    def norm(**kw):
        base = dict(clean_text=False, handle_chinese_chars=False, strip_accents=False, lowercase=False)
        base.update(kw)
        return normalizers.BertNormalizer(**base)

    n_clean, n_strip, n_lower = norm(clean_text=True), norm(strip_accents=True), norm(lowercase=True)
    bert_pt = pre_tokenizers.BertPreTokenizer()
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    out = {k: [] for k in ("other_add", "other_remove")}
    out.update({k: {} for k in ("strip_accents", "lowercase", "bert_class", "byte_level_class")})
    for cp in range(MAX_CP):
        if _is_surrogate(cp):
            continue
        c = chr(cp)
        if cp not in (0, 0xFFFD) and cp not in WHITESPACE and c not in "\t\n\r":
            ref = n_clean.normalize_str(c) == ""
            if ref != py_is_other(cp):
                out["other_add" if ref else "other_remove"].append(cp)
        ref = n_strip.normalize_str(c)
        if ref != py_strip_accents(c):
            out["strip_accents"][cp] = ref
        ref = n_lower.normalize_str(c)
        if ref != py_lower(c):
            out["lowercase"][cp] = ref
        words = [w for w, _ in bert_pt.pre_tokenize_str(f"a{c}a")]
        ref = "space" if words == ["a", "a"] else "punct" if words == ["a", c, "a"] else "word"
        if ref != py_bert_class(cp):
            out["bert_class"][cp] = ref
        if len(bl.pre_tokenize_str(f"a{c}")) == 1:
            ref = "L"
        elif len(bl.pre_tokenize_str(f"1{c}")) == 1:
            ref = "N"
        elif len(bl.pre_tokenize_str(f"!{c}")) == 1:
            ref = "O"
        else:
            ref = "S"
        if ref != py_byte_level_class(cp):
            out["byte_level_class"][cp] = ref
    out["unidata_version"] = unicodedata.unidata_version
    out["tokenizers_version"] = tokenizers.__version__
    return out


def main(argv: list[str] | None = None) -> int:  # pragma: no cover
    argv = sys.argv[1:] if argv is None else argv
    if argv != ["--regenerate"]:
        print("usage: python -m image.tokenizer.unicode_ref --regenerate", file=sys.stderr)
        return 2
    data = _measure()
    OVERRIDES_PATH.write_text(json.dumps(data, ensure_ascii=True, sort_keys=True, indent=0) + "\n")
    sizes = {k: len(v) for k, v in data.items() if isinstance(v, (list, dict))}
    print(f"wrote {OVERRIDES_PATH.name}: {sizes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
