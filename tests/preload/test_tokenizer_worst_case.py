"""Worst-case texts against Hugging Face ``tokenizers``: right truncation that stops early,
the WordPiece bounds, the word cache's byte budget, added tokens that absorb whitespace.

No timings here: ``python -m bench.tokenizer`` times the same shapes (``worst_case_texts``).
"""

from __future__ import annotations

import functools
import gc
import json
import random
import re
import string
import sys
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import edge.preload.tokenizer as tokenizer_module
from bench.tokenizer import MAX_TEXT_BYTES, worst_case_texts
from edge.preload import tokenizer_models, tokenizer_text
from edge.preload.tokenizer import Tokenizer
from edge.preload.tokenizer_models import WordPiece
from edge.preload.tokenizer_text import _WS, AddedTokenSplitter

tokenizers = pytest.importorskip("tokenizers")


def _cut(text: str, size: int) -> str:
    return text.encode("utf-8")[:size].decode("utf-8", errors="ignore")


@pytest.fixture(scope="module")
def shapes() -> dict[str, str]:
    """Each worst-case shape at full size (32 KB), and cut to sizes around the truncation."""
    out = {}
    for seed in (0, 1):
        for name, text in worst_case_texts(seed).items():
            assert len(text.encode("utf-8")) <= MAX_TEXT_BYTES, name
            out[f"{name}/{seed}"] = text
            for size in (40, 700, 2500):
                out[f"{name}/{seed}/{size}"] = _cut(text, size)
    return out


@functools.lru_cache(maxsize=None)
def _reference(json_path: str, max_length: int | None):
    ref = tokenizers.Tokenizer.from_file(json_path)
    ref.no_padding()
    if max_length is None:
        ref.no_truncation()
    else:
        ref.enable_truncation(max_length)
    return ref


def _check(tok: Tokenizer, json_path: str, texts: dict[str, str], max_length: int) -> None:
    """Ids and the truncated flag of ``encode`` and ``encode_batch`` equal the reference's
    (truncated: the untruncated reference has more ids; its ``overflowing`` costs seconds)."""
    names = list(texts)
    batch_texts = [texts[n] for n in names]
    want = [e.ids for e in _reference(json_path, max_length).encode_batch(batch_texts)]
    flags = [len(e.ids) > max_length for e in _reference(json_path, None).encode_batch(batch_texts)]
    bad = []
    for name, w, flag in zip(names, want, flags):
        enc = tok.encode(texts[name], max_length=max_length)
        if enc.ids != w or enc.truncated != flag:
            bad.append(f"{name}: ours {enc.ids[:8]}.. ({len(enc.ids)}, {enc.truncated}), "
                       f"reference {w[:8]}.. ({len(w)}, {flag})")
    assert not bad, "\n".join(bad[:8])
    batch = tok.encode_batch(batch_texts, length=max_length, max_length=max_length)
    assert batch.truncated == flags
    assert [row[:k] for row, k in zip(batch.input_ids.tolist(), batch.token_counts)] == want


# -- MiniLM (WordPiece, Bert normalizer and pre-tokenizer) -----------------------------------


@pytest.mark.process
@pytest.mark.parametrize("max_length", [256, 2, 3, 128, 512])
def test_minilm_shapes(minilm_fb, minilm_json, shapes, max_length):
    if max_length != 256:  # the serving length gets the 32 KB texts; the reference's overflow costs seconds
        shapes = {k: v for k, v in shapes.items() if k.count("/") == 2}
    _check(Tokenizer.open(minilm_fb), minilm_json, shapes, max_length)


@pytest.mark.process
def test_minilm_shapes_untruncated(minilm_fb, minilm_json, shapes):
    """``tokenize`` (no truncation) keeps the whole-text path."""
    ref = _reference(minilm_json, None)
    tok = Tokenizer.open(minilm_fb)
    names = list(shapes)
    for name, w in zip(names, ref.encode_batch([shapes[n] for n in names], add_special_tokens=False)):
        assert tok.tokenize(shapes[name]) == w.ids, name


def _boundary_texts() -> dict[str, str]:
    """Texts of 250..260 tokens (MiniLM): the truncated flag at the edge of 256."""
    out = {}
    for n in range(250, 260):
        out[f"words{n}"] = " ".join(["hello"] * n)
        out[f"masks{n}"] = "[MASK]" * n
        out[f"mixed{n}"] = " ".join(["hello", "[MASK]", "中"] * (n // 3) + ["x"] * (n % 3))
        out[f"pieces{n}"] = "unaffordable " * (n // 3)  # three pieces a word
    return out


def test_minilm_truncation_boundary(minilm_fb, minilm_json):
    _check(Tokenizer.open(minilm_fb), minilm_json, _boundary_texts(), 256)


@pytest.fixture
def small_chunks(monkeypatch):
    """Cut every segment into pieces of a few characters, so cuts fall everywhere."""
    monkeypatch.setattr(tokenizer_module, "_CHUNK_FIRST", 3)
    monkeypatch.setattr(tokenizer_module, "_CHUNK_MAX", 7)


@pytest.mark.process
def test_minilm_small_chunks(minilm_fb, minilm_json, shapes, parity_texts, small_chunks):
    texts = {f"real{i}": t for i, t in enumerate(parity_texts[:1500] + parity_texts[-30:])}
    texts.update((k, v) for k, v in shapes.items() if k.endswith("/700"))
    texts.update(_boundary_texts())
    tok = Tokenizer.open(minilm_fb)
    for max_length in (8, 256, 4096):
        _check(tok, minilm_json, texts, max_length)


_steering = st.lists(
    st.one_of(
        st.sampled_from(list(" \t\n\u3000\u00a0\u200b'.,!?-#[]<>|sSé中ĸ0\u0301") + ["[MASK]", "[CLS]", "<pad>"]),
        st.characters(categories=("Zs", "Po", "Mn", "Nd", "Lu", "Ll", "Lo", "Cc", "So")),
    ),
    max_size=60,
).map("".join)
@functools.lru_cache(maxsize=None)
def _opened(path: str) -> Tokenizer:
    return Tokenizer.open(path)  # the chunk sizes are read per call: one tokenizer serves every example


_hyp = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.process
@_hyp
@given(text=_steering, first=st.integers(1, 9), most=st.integers(1, 17), max_length=st.sampled_from([2, 5, 17, 64]))
def test_minilm_chunks_hypothesis(minilm_fb, minilm_json, text, first, most, max_length):
    ref = _reference(minilm_json, max_length)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tokenizer_module, "_CHUNK_FIRST", first)
        mp.setattr(tokenizer_module, "_CHUNK_MAX", max(first, most))
        enc = _opened(minilm_fb).encode(text, max_length=max_length)
    want = ref.encode(text).ids
    assert (enc.ids, enc.truncated) == (want, len(_reference(minilm_json, None).encode(text).ids) > max_length)


# -- byte-level BPE (the ByteLevel split is cut only where it is safe) ------------------------


@pytest.mark.parametrize("chunks", ["default", "small"])
def test_bpe_shapes(bpe, shapes, chunks, monkeypatch):
    _, json_path, fb = bpe
    if chunks == "small":
        monkeypatch.setattr(tokenizer_module, "_CHUNK_FIRST", 2)
        monkeypatch.setattr(tokenizer_module, "_CHUNK_MAX", 11)
    # BPE merges cost O(n^2) in a piece: shapes without spaces stay short here
    texts = {k: _cut(v, 300) for k, v in shapes.items() if k.endswith("/700")}
    texts.update(_boundary_texts())
    tok = Tokenizer.open(fb)
    for max_length in (1, 16, 256, 4096):
        _check(tok, json_path, texts, max_length)


@_hyp
@given(text=_steering, first=st.integers(1, 9), most=st.integers(1, 17), max_length=st.sampled_from([1, 4, 17, 64]))
def test_bpe_chunks_hypothesis(bpe, text, first, most, max_length):
    _, json_path, fb = bpe
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tokenizer_module, "_CHUNK_FIRST", first)
        mp.setattr(tokenizer_module, "_CHUNK_MAX", max(first, most))
        enc = _opened(fb).encode(text, max_length=max_length)
    want = _reference(json_path, max_length).encode(text).ids
    assert (enc.ids, enc.truncated) == (want, len(_reference(json_path, None).encode(text).ids) > max_length)


# -- WordPiece bounds ------------------------------------------------------------------------


def _unbounded(model: WordPiece, word: str) -> tuple[int, ...]:
    """The greedy longest match as it was: every end from the word's end down."""
    if len(word) > model._max_chars:
        return (model._unk,)
    get, prefix = model._vocab.get, model._prefix.decode("utf-8")
    out, start, n = [], 0, len(word)
    while start < n:
        end, cur = n, -1
        while start < end:
            cur = get(prefix + word[start:end] if start else word[start:end])
            if cur >= 0:
                break
            end -= 1
        if cur < 0:
            return (model._unk,)
        out.append(cur)
        start = end
    return tuple(out)


def _random_words(vocab_tokens: list[str], n: int, seed: int = 3) -> list[str]:
    rng = random.Random(seed)
    alphabets = [string.ascii_lowercase, "jquvwy", "aeiou", "éèçñüßĸǂ", "абвгдеж", "ก่ขคง", "中文字", "0123456789#",
                 string.ascii_lowercase + "ĸ", "abcUNKCLS[]#"]
    words = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.5:
            alphabet = rng.choice(alphabets)
            words.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 101))))
        elif kind < 0.8:  # vocabulary pieces glued together, continuation prefixes dropped
            words.append("".join(rng.choice(vocab_tokens).removeprefix("##") for _ in range(rng.randint(1, 12))))
        else:  # a piece with one odd character inside
            w = "".join(rng.choice(vocab_tokens).removeprefix("##") for _ in range(rng.randint(1, 8)))
            i = rng.randint(0, len(w))
            words.append(w[:i] + rng.choice("ĸǂ中#é\u0301A") + w[i:])
    return words


@pytest.mark.process
def test_wordpiece_bound_equals_unbounded(minilm_fb):
    tok = Tokenizer.open(minilm_fb)
    model = tok.model
    tokens = [tok.id_to_token(i) for i in range(tok.vocab_size)]
    words = _random_words(tokens, 2000) + tokens[::7]
    bad = [w for w in words if model._tokenize(w) != _unbounded(model, w)]
    assert not bad, bad[:10]
    assert (model._first_max, model._next_max) == (18, 10)  # MiniLM: "telecommunications", "##ification"
    assert "q" in model._first_chars and "q" in model._later_chars
    assert "ĸ" not in model._first_chars and "ĸ" not in model._later_chars  # in no entry


@pytest.mark.parametrize("prefix", ["", "@@", "#"])
def test_wordpiece_other_prefixes(tmp_path, minilm_json, prefix):
    """An empty prefix, one no entry has, one shorter than the entries' ("#" of "##x")."""
    from image.tokenizer.compile import compile_tokenizer_json

    data = json.loads(open(minilm_json, encoding="utf-8").read())
    data["model"]["continuing_subword_prefix"] = prefix
    data["padding"] = data["truncation"] = None
    path = tmp_path / "prefix.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    ref = tokenizers.Tokenizer.from_file(str(path))
    tok = Tokenizer.from_bytes(compile_tokenizer_json(path))
    tokens = [tok.id_to_token(i) for i in range(tok.vocab_size)]
    words = [w.lower() for w in _random_words(tokens, 600, seed=5)]
    want = ref.encode_batch(words, add_special_tokens=False)
    bad = [w for w, e in zip(words, want) if tok.tokenize(w) != e.ids]
    assert not bad, bad[:10]


def test_vocab_longest_and_alphabet(minilm_fb, minilm_json):
    vocab = json.load(open(minilm_json, encoding="utf-8"))["model"]["vocab"]
    table = Tokenizer.open(minilm_fb).vocab
    assert table.longest() == max(len(t.encode()) for t in vocab)
    assert table.longest(b"##") == max(len(t.encode()) - 2 for t in vocab if t.startswith("##"))
    assert table.longest(b"no such prefix") == -1
    first, inner = table.alphabet()
    assert first == {t[0] for t in vocab if t}
    assert inner == {c for t in vocab for c in t[1:]}


def test_preparing_the_tokenizer_imports_nothing_more(minilm_fb):
    """Boot's prepare_tokenizer runs on the main thread before READY: numpy's np.unique imported
    numpy.ma there (7 ms of the boot here); the alphabet is made without it."""
    import subprocess

    code = ("import sys; from edge.preload.tokenizer import Tokenizer; tok = Tokenizer.open(sys.argv[1]); "
            "before = set(sys.modules); tok.prepare(); print(sorted(set(sys.modules) - before))")
    out = subprocess.run([sys.executable, "-c", code, str(minilm_fb)], capture_output=True, text=True, check=True)
    new = eval(out.stdout)  # a list of module names
    assert not [m for m in new if m.startswith("numpy")], new


# -- the word cache --------------------------------------------------------------------------


def _long_words(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(60, 100))) for _ in range(n)]


def _real_bytes(cache: dict) -> int:
    return sum(sys.getsizeof(k) + sys.getsizeof(v) + 32 * len(v) for k, v in cache.items()) + sys.getsizeof(cache)


@pytest.mark.process
def test_word_cache_byte_budget(minilm_fb, minilm_json):
    """Many long unique words: the cache stays under its budget and the ids stay right."""
    tok = Tokenizer.open(minilm_fb)
    model = tok.model
    assert model.cache_budget == tokenizer_models.WORD_CACHE_BYTES == 8 << 20
    model.cache_budget = 200_000  # ~100 long words; the default needs ~5,000 of them to fill
    ref = _reference(minilm_json, None)
    words = _long_words(1500, seed=11)
    texts = [" ".join(words[i : i + 100]) for i in range(0, len(words), 100)]
    high = 0
    for text, want in zip(texts, ref.encode_batch(texts, add_special_tokens=False)):
        assert tok.tokenize(text) == want.ids
        assert model.cache_bytes <= model.cache_budget
        assert _real_bytes(model._cache) <= model.cache_budget + 64 * 1024  # the dict's own table
        high = max(high, len(model._cache))
    assert 20 < high < 1500  # it cached, and it cleared


def test_word_cache_skips_long_words(minilm_fb):
    """A word over max_input_chars_per_word is [UNK] without a cache entry: 64 texts that are each
    one 32 KB word grew the cache by 2 MB before (3.2 GB for a full cache)."""
    tok = Tokenizer.open(minilm_fb)
    rng = random.Random(2)
    for _ in range(8):
        text = "".join(rng.choice(string.ascii_lowercase) for _ in range(MAX_TEXT_BYTES))
        assert tok.encode(text, max_length=256).ids == [101, tok.unk_id, 102]
        assert tok.tokenize(text) == [tok.unk_id]
    assert tok.model._cache == {} and tok.model.cache_bytes == 0


@pytest.mark.process
def test_word_cache_accounting_covers_tracemalloc(minilm_fb):
    """``cache_bytes`` is at least what the allocator holds for the entries (within 5%)."""
    tok = Tokenizer.open(minilm_fb)
    tok.encode("warm up the first word")
    for length in (4, 20, 100):
        tok.model._cache.clear()
        tok.model.cache_bytes = 0
        rng = random.Random(length)
        texts = [" ".join("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, length)))
                          for _ in range(200)) for _ in range(2)]  # fmt: skip
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for text in texts:
            tok.tokenize(text)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert held <= 1.05 * tok.model.cache_bytes, (length, held, tok.model.cache_bytes)


def test_char_memo_is_bounded_and_transparent(minilm_fb, monkeypatch):
    texts = list(worst_case_texts(4, limit=3000).values())
    want = [Tokenizer.open(minilm_fb).encode(t, max_length=512).ids for t in texts]
    monkeypatch.setattr(tokenizer_text, "CHAR_MEMO_MAX", 16)
    tok = Tokenizer.open(minilm_fb)
    assert [tok.encode(t, max_length=512).ids for t in texts] == want
    assert len(tok._char_map) <= 16


# -- added tokens that absorb whitespace -----------------------------------------------------


def _grouped_segments(tokens: list[tuple[int, str, bool, bool]], text: str) -> list:
    """The splitter as it was: whitespace inside the pattern, a group per token."""
    alts, ids = [], {}
    for tid, content, lstrip, rstrip in sorted(tokens, key=lambda t: -len(t[1])):
        if content and content not in ids:
            ids[content] = tid
            alts.append((f"[{_WS}]*" if lstrip else "") + f"({re.escape(content)})" + (f"[{_WS}]*" if rstrip else ""))
    out, pos = [], 0
    for m in re.compile("|".join(alts)).finditer(text):
        if m.start() > pos:
            out.append(text[pos : m.start()])
        out.append(ids[next(g for g in m.groups() if g is not None)])
        pos = m.end()
    if pos < len(text):
        out.append(text[pos:])
    return out


# No content here begins another's: where one does ("ab" lstrip, "abc"), the pattern took the
# lstrip token from the whitespace before, tokenizers (and now ours) the longest content.
_STRIP_TOKENS = [(1, "[MASK]", True, True), (2, "[SEP]", False, True), (3, "[CLS]", True, False),
                 (4, "<s>", False, False), (5, "MASK", True, True), (6, "S]", False, True)]  # fmt: skip


@given(st.lists(st.sampled_from([" ", "\t", "\u3000", "\n", "[MASK]", "[SEP]", "[CLS]", "<s>", "MASK", "]", "[", "S"]),
                max_size=30).map("".join))  # fmt: skip
@settings(max_examples=500, deadline=None)
def test_added_tokens_strip_as_before(text):
    splitter = AddedTokenSplitter(_STRIP_TOKENS)
    assert splitter._grouped is None
    assert splitter.split(text) == _grouped_segments(_STRIP_TOKENS, text)


def test_added_tokens_with_spaces_keep_the_grouped_pattern():
    tokens = _STRIP_TOKENS + [(7, " pad", True, False)]
    splitter = AddedTokenSplitter(tokens)
    assert splitter._grouped is not None
    for text in ["a  pad [MASK]  b", "   pad", "[CLS]  pad  [SEP] x"]:
        assert splitter.split(text) == _grouped_segments(tokens, text)


def test_added_tokens_strip_against_reference(tmp_path, minilm_json):
    from image.tokenizer.compile import compile_tokenizer_json

    data = json.loads(open(minilm_json, encoding="utf-8").read())
    data["padding"] = data["truncation"] = None
    flags = {"[MASK]": (True, True), "[SEP]": (False, True), "[CLS]": (True, False)}
    for t in data["added_tokens"]:
        t["lstrip"], t["rstrip"] = flags.get(t["content"], (False, False))
    path = tmp_path / "strip.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    ref = tokenizers.Tokenizer.from_file(str(path))
    ref.add_tokens([tokenizers.AddedToken("abc", normalized=False),  # "ab" begins it: the longest wins
                    tokenizers.AddedToken("ab", lstrip=True, rstrip=True, normalized=False)])  # fmt: skip
    ref.save(str(path))
    tok = Tokenizer.from_bytes(compile_tokenizer_json(path))
    assert tok.tokenize(" abc") == [tok.token_to_id("abc")]  # the pattern made it ["ab", "c"]
    rng = random.Random(0)
    parts = [" ", "  ", "\t", "\u3000", "\n", "[MASK]", "[SEP]", "[CLS]", "[PAD]", "ab", "abc", "c", "x", "[", "]"]
    texts = ["".join(rng.choice(parts) for _ in range(rng.randint(0, 12))) for _ in range(3000)]
    texts += [" " * 20000 + "[MASK]" + " " * 10000, "\u3000" * 9000 + "[CLS]"]  # O(n^2) with [ws]* in the pattern
    want = ref.encode_batch(texts)
    bad = [t for t, w in zip(texts, want) if tok.encode(t).ids != w.ids]
    assert not bad, [t[:40] for t in bad[:5]]


@pytest.fixture(scope="module")
def bpe_normalized(bpe, tmp_path_factory):
    """The byte-level BPE behind a normalizer that removes characters (controls, accents): a
    segment's first pieces can map to nothing before add_prefix_space is decided."""
    from image.tokenizer.compile import compile_tokenizer_json

    _, json_path, _ = bpe
    data = json.loads(open(json_path, encoding="utf-8").read())
    data["normalizer"] = {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                          "strip_accents": True, "lowercase": False}  # fmt: skip
    d = tmp_path_factory.mktemp("bpe_norm")
    (d / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    (d / "tokenizer.fb").write_bytes(compile_tokenizer_json(d / "tokenizer.json"))
    return str(d / "tokenizer.json"), str(d / "tokenizer.fb")


@_hyp
@given(text=_steering, removed=st.integers(0, 12), first=st.integers(1, 5), max_length=st.sampled_from([1, 6, 64]))
def test_bpe_removed_characters_first(bpe_normalized, text, removed, first, max_length):
    json_path, fb = bpe_normalized
    text = "\x00\u0301" * removed + text
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tokenizer_module, "_CHUNK_FIRST", first)
        mp.setattr(tokenizer_module, "_CHUNK_MAX", first + 3)
        enc = _opened(fb).encode(text, max_length=max_length)
    want = _reference(json_path, max_length).encode(text).ids
    full = _reference(json_path, None).encode(text).ids
    assert (enc.ids, enc.truncated) == (want, len(full) > max_length)
    assert _opened(fb).tokenize(text) == full  # was [prefix space] for a text of removed characters
