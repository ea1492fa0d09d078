"""Unit tests of edge.preload.tokenizer: loading in place, errors, batches, truncation."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import edge.preload.tokenizer as tokenizer_module
from edge.errors import ErrorCode, TokenizerError
from edge.preload import tokenizer_models
from edge.preload.tokenizer import EncodedBatch, Encoding, Tokenizer


def test_public_names():
    assert sorted(tokenizer_module.__all__) == sorted(
        ["load_tokenizer", "Tokenizer", "Encoding", "EncodedBatch", "FORMAT_VERSION", "FILE_IDENTIFIER"]
    )


@pytest.mark.parametrize(
    "content",
    [b"", b"garbage", b"\x00" * 64, b"{\"model\": {}}", b"\x10\x00\x00\x00EDTK" + b"\xff" * 8],
    ids=["empty", "short", "zeros", "json", "identifier-only"],
)
def test_invalid_files_are_refused(tmp_path, content):
    path = tmp_path / "bad.fb"
    path.write_bytes(content)
    with pytest.raises(TokenizerError) as err:
        Tokenizer.open(path)
    assert err.value.code == ErrorCode.TOKENIZER_INVALID
    assert str(path) in str(err.value)


def test_truncated_file_is_refused(tmp_path, minilm_fb):
    data = open(minilm_fb, "rb").read()
    path = tmp_path / "cut.fb"
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(TokenizerError):
        Tokenizer.open(path).encode("hello world")


def test_missing_file(tmp_path):
    with pytest.raises(TokenizerError) as err:
        Tokenizer.open(tmp_path / "nope.fb")
    assert err.value.code == ErrorCode.TOKENIZER_INVALID


def test_open_reads_in_place(minilm_fb):
    """Opening allocates far less than the vocabulary: nothing is decoded at load."""
    Tokenizer.open(minilm_fb)  # warm imports and code paths
    tracemalloc.start()
    tok = Tokenizer.open(minilm_fb)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    vocab_bytes = sum(len(tok.id_to_token(i).encode()) for i in range(tok.vocab_size))
    assert vocab_bytes > 150_000
    assert peak < 64_000, f"open allocated {peak} bytes"
    assert isinstance(tok._mapping, __import__("mmap").mmap)


def test_vocabulary_lookup_round_trips(minilm_fb, minilm_json):
    import json

    vocab = json.load(open(minilm_json, encoding="utf-8"))["model"]["vocab"]
    tok = Tokenizer.open(minilm_fb)
    assert tok.vocab_size == len(vocab)
    for token, i in vocab.items():
        assert tok.token_to_id(token) == i
        assert tok.id_to_token(i) == token
    assert tok.token_to_id("definitely-not-a-token") is None


def test_attributes(minilm_fb):
    tok = Tokenizer.open(minilm_fb)
    assert tok.pad_id == 0
    assert tok.model_max_length == 128  # the tokenizer.json's truncation
    assert tok.original_ids is None
    assert tok.num_special_tokens == 2


def test_encode_defaults_to_model_max_length(minilm_fb):
    tok = Tokenizer.open(minilm_fb)
    long_text = " ".join(["word"] * 300)
    enc = tok.encode(long_text)
    assert isinstance(enc, Encoding)
    assert len(enc.ids) == 128 and enc.truncated
    assert enc.ids[0] == tok.token_to_id("[CLS]") and enc.ids[-1] == tok.token_to_id("[SEP]")
    enc = tok.encode(long_text, max_length=400)
    assert len(enc.ids) == 302 and not enc.truncated
    with pytest.raises(ValueError):
        tok.encode("x", max_length=1)


def test_encode_batch(minilm_fb):
    tok = Tokenizer.open(minilm_fb)
    texts = ["hello world", "", "a much longer sentence with quite a few more words in it than the others"]
    batch = tok.encode_batch(texts, length=16)
    assert isinstance(batch, EncodedBatch)
    assert batch.input_ids.shape == (3, 16) and batch.input_ids.dtype == np.int64
    assert batch.attention_mask.shape == (3, 16) and batch.attention_mask.dtype == np.int64
    for row, text in enumerate(texts):
        ids = tok.encode(text, max_length=16).ids
        n = len(ids)
        assert batch.token_counts[row] == n
        assert batch.input_ids[row, :n].tolist() == ids
        assert (batch.input_ids[row, n:] == tok.pad_id).all()
        assert batch.attention_mask[row].tolist() == [1] * n + [0] * (16 - n)
    assert batch.truncated == [False, False, True]
    assert batch.input_ids[2, -1] == tok.token_to_id("[SEP]")  # the suffix survives truncation


def test_encode_batch_limits(minilm_fb):
    tok = Tokenizer.open(minilm_fb)
    batch = tok.encode_batch(["one two three four five"], length=32, max_length=4)
    assert batch.token_counts == [4] and batch.truncated == [True]
    assert batch.attention_mask.sum() == 4
    empty = tok.encode_batch([], length=8)
    assert empty.input_ids.shape == (0, 8)
    with pytest.raises(ValueError):
        tok.encode_batch(["x"], length=1)


def test_word_cache_is_bounded_and_transparent(minilm_fb, monkeypatch):
    tok = Tokenizer.open(minilm_fb)
    text = "tokenization caches words; unaffordable antidisestablishmentarianism"
    expected = tok.encode(text).ids
    monkeypatch.setattr(tokenizer_models, "WORD_CACHE_MAX", 2)
    fresh = Tokenizer.open(minilm_fb)
    for _ in range(3):
        assert fresh.encode(text).ids == expected
    assert len(fresh.model._cache) <= 2


def test_from_bytes_equals_open(minilm_fb):
    data = open(minilm_fb, "rb").read()
    a, b = Tokenizer.from_bytes(data), Tokenizer.open(minilm_fb)
    text = "Same bytes, same ids: ÉCOLE 中文 👍"
    assert a.encode(text).ids == b.encode(text).ids
    b.close()
