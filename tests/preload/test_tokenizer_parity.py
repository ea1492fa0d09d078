"""Parity of the compiled tokenizer with Hugging Face ``tokenizers``: same ids, same masks."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge.preload.tokenizer import Tokenizer

tokenizers = pytest.importorskip("tokenizers")


def _mismatches(tok: Tokenizer, ref, texts: list[str]) -> list[tuple[str, list[int], list[int]]]:
    want = [e.ids for e in ref.encode_batch(texts)]
    return [(t, tok.encode(t).ids, w) for t, w in zip(texts, want) if tok.encode(t).ids != w]


def _show(bad) -> str:
    return "\n".join(f"{t[:80]!r}: ours {a[:12]} reference {b[:12]}" for t, a, b in bad[:5])


def test_minilm_real_texts(minilm_fb, hf_minilm, parity_texts):
    assert len(parity_texts) >= 10_000
    bad = _mismatches(Tokenizer.open(minilm_fb), hf_minilm, parity_texts)
    assert not bad, f"{len(bad)} of {len(parity_texts)} differ:\n{_show(bad)}"


def test_bpe_real_texts(bpe, parity_texts):
    ref, _, fb = bpe
    bad = _mismatches(Tokenizer.open(fb), ref, parity_texts)
    assert not bad, f"{len(bad)} of {len(parity_texts)} differ:\n{_show(bad)}"


def test_batch_matches_reference_padding(minilm_fb, minilm_json, parity_texts):
    """input_ids and attention_mask of a padded batch equal the reference's fixed padding."""
    ref = tokenizers.Tokenizer.from_file(minilm_json)
    ref.enable_padding(length=64, pad_id=0, pad_token="[PAD]")
    ref.enable_truncation(64)
    texts = parity_texts[:300] + parity_texts[-30:]
    want = ref.encode_batch(texts)
    got = Tokenizer.open(minilm_fb).encode_batch(texts, length=64)
    assert got.input_ids.tolist() == [e.ids for e in want]
    assert got.attention_mask.tolist() == [e.attention_mask for e in want]


@pytest.mark.parametrize("max_length", [2, 3, 7, 16, 128, 512])
def test_truncation(minilm_fb, minilm_json, parity_texts, max_length):
    ref = tokenizers.Tokenizer.from_file(minilm_json)
    ref.no_padding()
    ref.enable_truncation(max_length)
    tok = Tokenizer.open(minilm_fb)
    texts = parity_texts[:500] + parity_texts[-30:]
    for text, want in zip(texts, ref.encode_batch(texts)):
        enc = tok.encode(text, max_length=max_length)
        assert enc.ids == want.ids, text
        assert enc.truncated == (len(tok.encode(text, max_length=10**6).ids) > max_length)


def test_left_truncation(tmp_path, minilm_json, parity_texts):
    from image.tokenizer.compile import compile_tokenizer_json

    data = json.loads(open(minilm_json, encoding="utf-8").read())
    data["truncation"] = {"direction": "Left", "max_length": 9, "strategy": "LongestFirst", "stride": 0}
    data["padding"] = None
    path = tmp_path / "left.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    ref = tokenizers.Tokenizer.from_file(str(path))
    tok = Tokenizer.from_bytes(compile_tokenizer_json(path))
    assert tok.model_max_length == 9
    bad = _mismatches(tok, ref, parity_texts[:500])
    assert not bad, _show(bad)


def _sweep(tok: Tokenizer, ref, sep: str) -> list[int]:
    """Every code point, each between separators, in chunks: first code points of differing chunks."""
    bad = []
    step = 4096
    for start in range(0, 0x110000, step):
        chars = [chr(c) for c in range(start, start + step) if not 0xD800 <= c <= 0xDFFF]
        if not chars:
            continue
        text = sep.join(chars)
        if tok.tokenize(text) != ref.encode(text, add_special_tokens=False).ids:
            bad.append(start)
    return bad


@pytest.mark.slow
def test_every_code_point_minilm(minilm_fb, minilm_json):
    ref = tokenizers.Tokenizer.from_file(minilm_json)
    ref.no_padding()
    ref.no_truncation()
    bad = _sweep(Tokenizer.open(minilm_fb), ref, " ")
    assert not bad, [hex(b) for b in bad]


@pytest.mark.slow
def test_every_code_point_bpe(bpe):
    ref, _, fb = bpe
    if ref.pre_tokenizer.add_prefix_space:
        pytest.skip("same split table as the gpt2 variant; one sweep is enough")
    bad = _sweep(Tokenizer.open(fb), ref, " ")
    assert not bad, [hex(b) for b in bad]


# -- random unicode -------------------------------------------------------------------------

_any_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=60)
# Mostly the characters that steer the pipeline: spaces, punctuation, marks, digits, letters.
_steering = st.text(
    st.one_of(
        st.sampled_from(list(" \t\n\r\u00a0\u3000\u200b\u200d\ufeff'.,!?-_#[]<>|sS0")),
        st.characters(categories=("Zs", "Po", "Ps", "Pe", "Mn", "Me", "Mc", "Nd", "No", "Lu", "Lo", "Cf", "So")),
    ),
    max_size=40,
)
_specials = st.lists(
    st.sampled_from(["[CLS]", "[SEP]", "[MASK]", "<|endoftext|>", "<pad>", " ", "ab", "É", "中"]), max_size=8
).map("".join)

_hyp = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_hyp
@given(text=st.one_of(_any_text, _steering, _specials))
def test_hypothesis_minilm(minilm_fb, hf_minilm, text):
    assert Tokenizer.open(minilm_fb).encode(text).ids == hf_minilm.encode(text).ids


@_hyp
@given(text=st.one_of(_any_text, _steering, _specials))
def test_hypothesis_bpe(bpe, text):
    ref, _, fb = bpe
    assert Tokenizer.open(fb).encode(text).ids == ref.encode(text).ids
