"""Both engines against sentence-transformers on >= 200 varied sentences, batched and single."""

from __future__ import annotations

import numpy as np
import pytest

from support.parity import ABS_MAX, COSINE_MIN, bucket_for, pad_batch


def _check(out: np.ndarray, ref: np.ndarray, what: str) -> None:
    assert out.dtype == np.float32 and out.shape == ref.shape, what
    cos = np.sum(out * ref, axis=1) / (np.linalg.norm(out, axis=1) * np.linalg.norm(ref, axis=1))
    diff = np.abs(out - ref).max(axis=1)
    worst = int(np.argmin(cos))
    assert cos.min() >= COSINE_MIN, f"{what}: cosine {cos.min():.7f} at row {worst}"
    assert diff.max() <= ABS_MAX, f"{what}: max abs diff {diff.max():.2e} at row {int(np.argmax(diff))}"


def test_sentences_cover_lengths_and_scripts(sentences, hf_tokenizer):
    lengths = [len(e.ids) for e in hf_tokenizer.encode_batch(sentences)]
    assert len(sentences) >= 200
    assert min(lengths) <= 3  # a single word: [CLS] word [SEP]
    assert max(lengths) == 256 and sum(n == 256 for n in lengths) >= 3  # truncated long texts
    scripts = {"Cyrillic": "ж", "Arabic": "م", "Hebrew": "ש", "Devanagari": "न", "Han": "你", "Hangul": "안",
               "Thai": "ส", "Greek": "Γ"}
    for name, ch in scripts.items():
        assert any(ch in s for s in sentences), name


def test_batched_parity(engine, sentences, reference, hf_tokenizer):
    encodings = [e.ids for e in hf_tokenizer.encode_batch(sentences)]
    out = np.empty_like(reference)
    for start in range(0, len(sentences), 16):  # mixed lengths in each batch, padded to a bucket
        rows = encodings[start : start + 16]
        ids, mask = pad_batch(rows, bucket_for(max(map(len, rows))))
        out[start : start + len(rows)] = engine.run(ids, mask)
    _check(out, reference, f"{engine.name} batched")


def test_single_parity(engine, sentences, reference, hf_tokenizer):
    encodings = [e.ids for e in hf_tokenizer.encode_batch(sentences)]
    out = np.empty_like(reference)
    for i, row in enumerate(encodings):
        # Padded to its bucket (what serving does); every 8th unpadded, an arbitrary length
        # (few of those: TorchScript re-profiles each new shape).
        length = len(row) if i % 8 == 0 else bucket_for(len(row))
        out[i] = engine.run(*pad_batch([row], length))[0]
    _check(out, reference, f"{engine.name} single")


def test_full_bucket_batch(engine, sentences, reference, hf_tokenizer):
    """A full (32, 256) batch: the largest shape served."""
    encodings = [e.ids for e in hf_tokenizer.encode_batch(sentences)]
    order = sorted(range(len(sentences)), key=lambda i: -len(encodings[i]))[:32]
    out = engine.run(*pad_batch([encodings[i] for i in order], 256))
    _check(out, reference[order], f"{engine.name} 32x256")


def test_padding_does_not_change_output(engine, hf_tokenizer):
    row = hf_tokenizer.encode("Padding must not leak into the mean.").ids
    a = engine.run(*pad_batch([row], len(row)))
    b = engine.run(*pad_batch([row], 128))
    np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("rows", [1, 3])
def test_rows_are_unit_length(engine, hf_tokenizer, rows):
    ids, mask = pad_batch([hf_tokenizer.encode("unit length").ids] * rows, 16)
    out = engine.run(ids, mask)
    assert out.shape == (rows, 384) and out.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
