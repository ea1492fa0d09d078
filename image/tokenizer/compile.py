"""Compile a Hugging Face tokenizer.json into the ``.fb`` the device maps.

    from image.tokenizer.compile import compile_tokenizer_json
    fb_bytes = compile_tokenizer_json("tokenizer.json")

Supported (everything else is refused with TOKENIZER_UNSUPPORTED, naming the component,
so a file is never compiled into something that encodes differently):

* normalizer: none, BertNormalizer (clean_text, handle_chinese_chars, strip_accents, lowercase);
* pre_tokenizer: BertPreTokenizer, ByteLevel (use_regex true; add_prefix_space);
* model: WordPiece (unk_token, continuing_subword_prefix, max_input_chars_per_word);
  BPE (merges by rank, unk_token, fuse_unk, ignore_merges; no dropout, byte_fallback,
  subword prefix or suffix);
* post_processor: none, TemplateProcessing (single: specials around $A), BertProcessing,
  RobertaProcessing, ByteLevel (changes offsets only);
* added_tokens: matched on the raw text (normalized false), lstrip / rstrip, not single_word;
* truncation: LongestFirst / OnlyFirst, left or right; padding: only its pad_id is kept
  (the device pads to the bucket it is given). The decoder is not needed to encode.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from functools import lru_cache
from pathlib import Path

from edge.errors import ErrorCode, TokenizerError
from edge.preload.tokenizer_fb.ModelKind import ModelKind
from edge.preload.tokenizer_fb.PreTokenizerKind import PreTokenizerKind
from edge.preload.tokenizer_fb.TruncationSide import TruncationSide
from edge.preload.tokenizer_text import ISOLATE, KEEP, LETTER, MAPPED, NUMBER, OTHER, REMOVE, SPACE, U0020, WHITESPACE
from image.tokenizer import unicode_ref
from image.tokenizer.spec import AddedTokenSpec, CharTableData, TokenizerSpec, build_char_table, to_fb

__all__ = ["compile_tokenizer_json", "spec_from_json", "unsupported"]


def unsupported(component: str, detail: str = "") -> TokenizerError:
    msg = f"tokenizer.json: {component} is not supported"
    return TokenizerError(msg + (f" ({detail})" if detail else ""), ErrorCode.TOKENIZER_UNSUPPORTED)


def invalid(detail: str) -> TokenizerError:
    return TokenizerError(f"tokenizer.json: {detail}", ErrorCode.TOKENIZER_INVALID)


def _type(section: dict | None) -> str | None:
    return None if section is None else section.get("type")


# -- character tables ----------------------------------------------------------------------


@lru_cache(maxsize=8)
def char_map_table(flags: tuple[bool, bool, bool, bool] | None, isolate: bool) -> CharTableData | None:
    """The char_map of BertNormalizer ``flags`` (clean, chinese, strip, lower) and, with
    ``isolate``, of the BertPreTokenizer's whitespace and punctuation split."""
    if flags is None and not isolate:
        return None
    clean, chinese, strip, lower = flags or (False, False, False, False)
    special = unicode_ref.overridden_code_points()

    def fn(cp: int):
        if 0xD800 <= cp <= 0xDFFF:  # never in valid text
            return KEEP, None
        c = chr(cp)
        if cp not in special and unicodedata.category(c) == "Cn" and not unicode_ref.is_chinese(cp):
            return KEEP, None  # unassigned: no step changes it (a shortcut for 800k code points)
        out = unicode_ref.bert_char(cp, clean_text=clean, chinese=chinese, strip_accents=strip,
                                    lowercase=lower, isolate=isolate)  # fmt: skip
        if out == c:
            return KEEP, None
        if out == "":
            return REMOVE, None
        if out == " ":
            return SPACE, None
        if out == f" {c} ":
            return ISOLATE, None
        return MAPPED, out

    return build_char_table(fn)


@lru_cache(maxsize=1)
def split_class_table() -> CharTableData:
    to_class = {"L": LETTER, "N": NUMBER, "O": OTHER}

    def fn(cp: int):
        if 0xD800 <= cp <= 0xDFFF:
            return OTHER, None
        k = unicode_ref.byte_level_class(cp)
        if k == "S":
            return (U0020 if cp == 0x20 else WHITESPACE), None
        return to_class[k], None

    return build_char_table(fn)


# -- sections --------------------------------------------------------------------------------


def _normalizer(section: dict | None) -> tuple[bool, bool, bool, bool] | None:
    kind = _type(section)
    if kind is None:
        return None
    if kind != "BertNormalizer":
        raise unsupported(f"normalizer '{kind}'")
    lower = bool(section.get("lowercase", True))
    strip = section.get("strip_accents")
    return (
        bool(section.get("clean_text", True)),
        bool(section.get("handle_chinese_chars", True)),
        lower if strip is None else bool(strip),
        lower,
    )


def _vocab_list(vocab: dict[str, int], what: str) -> list[str]:
    tokens = [None] * len(vocab)
    for tok, i in vocab.items():
        if not 0 <= i < len(vocab) or tokens[i] is not None:
            raise invalid(f"{what} ids are not 0..{len(vocab) - 1} (id {i} of {tok!r})")
        tokens[i] = tok
    return tokens


def _model(model: dict, spec: TokenizerSpec) -> None:
    kind = _type(model)
    if kind is None and "merges" in model:
        kind = "BPE"  # older files leave the type out
    if kind == "WordPiece":
        spec.model = ModelKind.WordPiece
        spec.vocab = _vocab_list(model["vocab"], "WordPiece vocab")
        spec.continuing_subword_prefix = model.get("continuing_subword_prefix", "##")
        spec.max_input_chars_per_word = int(model.get("max_input_chars_per_word", 100))
    elif kind == "BPE":
        spec.model = ModelKind.BPE
        if model.get("dropout") not in (None, 0, 0.0):
            raise unsupported(f"BPE dropout={model['dropout']!r}")
        if model.get("byte_fallback"):
            raise unsupported("BPE byte_fallback=true")
        for key in ("continuing_subword_prefix", "end_of_word_suffix"):
            if model.get(key):
                raise unsupported(f"BPE {key}={model.get(key)!r}")
        spec.vocab = _vocab_list(model["vocab"], "BPE vocab")
        spec.fuse_unk = bool(model.get("fuse_unk", False))
        spec.ignore_merges = bool(model.get("ignore_merges", False))
        ids = model["vocab"]
        by_pair: dict[tuple[int, int], int] = {}
        for r, m in enumerate(model.get("merges", [])):
            if isinstance(m, str):
                parts = m.split(" ")
                if len(parts) != 2:
                    raise invalid(f"BPE merge {m!r} is not two tokens")
            else:
                parts = list(m)
            a, b = parts
            if a not in ids or b not in ids or a + b not in ids:
                raise invalid(f"BPE merge {a!r} + {b!r}: a token is not in the vocabulary")
            by_pair[(ids[a], ids[b])] = r  # a repeated pair keeps its last rank, as tokenizers does
        order = sorted(by_pair.items(), key=lambda kv: kv[1])
        spec.merges = [(a, b, ids[spec.vocab[a] + spec.vocab[b]]) for (a, b), _ in order]
    else:
        raise unsupported(f"model '{kind}'")
    unk = model.get("unk_token")
    if unk is not None:
        if unk not in model["vocab"]:
            raise invalid(f"unk_token {unk!r} is not in the vocabulary")
        spec.unk_id = model["vocab"][unk]


def _pre_tokenizer(section: dict | None, spec: TokenizerSpec) -> None:
    kind = _type(section)
    if kind == "BertPreTokenizer":
        spec.pre_tokenizer = PreTokenizerKind.Bert
    elif kind == "ByteLevel":
        if not section.get("use_regex", True):
            raise unsupported("pre_tokenizer 'ByteLevel' with use_regex=false")
        spec.pre_tokenizer = PreTokenizerKind.ByteLevel
        spec.add_prefix_space = bool(section.get("add_prefix_space", True))
        spec.split_classes = split_class_table()
    else:
        raise unsupported(f"pre_tokenizer '{kind}'")


def _post_processor(section: dict | None, spec: TokenizerSpec, vocab: dict[str, int]) -> None:
    kind = _type(section)
    if kind in (None, "ByteLevel"):
        return
    if kind in ("BertProcessing", "RobertaProcessing"):
        spec.prefix_ids = [int(section["cls"][1])]
        spec.suffix_ids = [int(section["sep"][1])]
        return
    if kind != "TemplateProcessing":
        raise unsupported(f"post_processor '{kind}'")
    specials = section.get("special_tokens", {})
    seen_sequence = False
    for piece in section["single"]:
        if "Sequence" in piece:
            if piece["Sequence"]["id"] != "A" or seen_sequence:
                raise unsupported("post_processor 'TemplateProcessing' single template", json.dumps(section["single"]))
            seen_sequence = True
        elif "SpecialToken" in piece:
            name = piece["SpecialToken"]["id"]
            if name not in specials:
                raise invalid(f"TemplateProcessing names special token {name!r} without ids")
            (spec.suffix_ids if seen_sequence else spec.prefix_ids).extend(int(i) for i in specials[name]["ids"])
        else:
            raise unsupported("post_processor 'TemplateProcessing' piece", json.dumps(piece))
    if not seen_sequence:
        raise unsupported("post_processor 'TemplateProcessing' without $A")


def _added_tokens(items: list[dict], spec: TokenizerSpec) -> None:
    for t in items:
        content, tid = t["content"], int(t["id"])
        if t.get("normalized", False):
            raise unsupported(f"added token {content!r} with normalized=true")
        if t.get("single_word", False):
            raise unsupported(f"added token {content!r} with single_word=true")
        if tid >= len(spec.vocab) or spec.vocab[tid] != content:
            raise unsupported(f"added token {content!r} (id {tid}) outside the model's vocabulary")
        spec.added_tokens.append(
            AddedTokenSpec(tid, content, bool(t.get("special", False)), bool(t.get("lstrip")), bool(t.get("rstrip")))
        )


def _truncation(section: dict | None, spec: TokenizerSpec) -> None:
    if section is None:
        return
    strategy = section.get("strategy", "LongestFirst")
    if strategy not in ("LongestFirst", "OnlyFirst"):
        raise unsupported(f"truncation strategy '{strategy}'")
    direction = section.get("direction", "Right")
    if direction not in ("Right", "Left"):
        raise unsupported(f"truncation direction '{direction}'")
    spec.truncation_side = TruncationSide.Right if direction == "Right" else TruncationSide.Left
    spec.truncation_max_length = int(section["max_length"])


def spec_from_json(data: dict, source_sha256: str = "") -> TokenizerSpec:
    """The spec of a parsed tokenizer.json; raises TokenizerError on anything unsupported."""
    spec = TokenizerSpec(model=0, pre_tokenizer=0, vocab=[], source_sha256=source_sha256)
    flags = _normalizer(data.get("normalizer"))
    _pre_tokenizer(data.get("pre_tokenizer"), spec)
    _model(data["model"], spec)
    vocab = data["model"]["vocab"]
    spec.char_map = char_map_table(flags, spec.pre_tokenizer == PreTokenizerKind.Bert)
    _post_processor(data.get("post_processor"), spec, vocab)
    _added_tokens(data.get("added_tokens") or [], spec)
    _truncation(data.get("truncation"), spec)
    padding = data.get("padding")
    if padding is not None:
        spec.pad_id = int(padding.get("pad_id", 0))
    else:
        spec.pad_id = next((vocab[t] for t in ("[PAD]", "<pad>", "<|padding|>") if t in vocab), 0)
    spec.description = {
        "normalizer": _type(data.get("normalizer")),
        "pre_tokenizer": _type(data.get("pre_tokenizer")),
        "model": _type(data["model"]) or "BPE",
        "post_processor": _type(data.get("post_processor")),
        "unicode": {"unidata": unicode_ref.overrides_meta()},
    }
    spec.original_vocab_size = len(spec.vocab)
    return spec


def compile_tokenizer_json(path: str | Path) -> bytes:
    """tokenizer.json at ``path`` -> bytes of a ``.fb``."""
    raw = Path(path).read_bytes()
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise invalid(f"{path} is not JSON: {e}") from e
    return to_fb(spec_from_json(data, hashlib.sha256(raw).hexdigest()))
