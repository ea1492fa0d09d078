"""The package's own tokenizer feeding an engine, against sentence-transformers."""

from __future__ import annotations

import numpy as np

from support.parity import bucket_for


def test_package_end_to_end(engine, minilm_package, reference, sentences):
    from edge.preload.tokenizer import Tokenizer

    tok = Tokenizer.open(minilm_package / "tokenizer.fb")
    for start in range(0, len(sentences), 32):
        texts = sentences[start : start + 32]
        counts = [len(tok.encode(t, max_length=256).ids) for t in texts]
        batch = tok.encode_batch(texts, bucket_for(max(counts)), max_length=256)
        out = engine.run(batch.input_ids, batch.attention_mask)
        ref = reference[start : start + 32]
        assert np.abs(out - ref).max() <= 1e-4, f"{engine.name}: batch at {start}"
        assert (np.sum(out * ref, axis=1) >= 0.9999).all(), f"{engine.name}: batch at {start}"
