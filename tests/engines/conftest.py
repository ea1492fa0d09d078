"""Fixtures of the engine tests: the sentence-transformers reference and HF token ids."""

from __future__ import annotations

import os

import numpy as np
import pytest
from edge.engines import load_engine

from support.parity import parity_sentences

MAX_LEN = 256  # tokens, sentence-transformers' max_seq_length for this model


@pytest.fixture(scope="session")
def sentences() -> list[str]:
    s = parity_sentences()
    assert len(s) >= 200
    return s


@pytest.fixture(scope="session")
def hf_tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    from image.package import source_dir

    tok = tokenizers.Tokenizer.from_file(str(source_dir() / "tokenizer.json"))
    tok.no_padding()  # the shipped file pads to 128; we pad to buckets ourselves
    tok.enable_truncation(MAX_LEN)
    return tok


@pytest.fixture(scope="session")
def reference(sentences) -> np.ndarray:
    """sentence-transformers' encode(..., normalize_embeddings=True): (N, 384) float32."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    st = pytest.importorskip("sentence_transformers")
    from image.package import source_dir

    model = st.SentenceTransformer(str(source_dir()), device="cpu")
    assert model.max_seq_length == MAX_LEN
    return model.encode(sentences, batch_size=32, normalize_embeddings=True, convert_to_numpy=True)



@pytest.fixture(scope="session", params=["onnxruntime", "torchscript"])
def engine(request, minilm_package):
    """Each engine on the CPU, loaded once for the session."""
    eng = load_engine(minilm_package, request.param, device="cpu")
    yield eng
    eng.close()
