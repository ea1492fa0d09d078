"""Fixtures of the tokenizer tests: compiled tokenizers and their Hugging Face references."""

from __future__ import annotations

import pytest

from image.tokenizer.samples import edge_case_texts, gettext_texts, train_byte_level_bpe

N_REAL_TEXTS = 12_000  # real gettext sentences in the parity tests (the issue asks >= 10,000)


@pytest.fixture(scope="session")
def minilm_fb(tmp_path_factory, minilm_json) -> str:
    from image.tokenizer.compile import compile_tokenizer_json

    path = tmp_path_factory.mktemp("tok") / "minilm.fb"
    path.write_bytes(compile_tokenizer_json(minilm_json))
    return str(path)


@pytest.fixture(scope="session")
def hf_minilm(minilm_json):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(minilm_json)
    tok.no_padding()  # the file pads to 128; the device pads to the bucket it is given
    return tok


@pytest.fixture(scope="session")
def real_texts() -> list[str]:
    texts = gettext_texts(N_REAL_TEXTS, seed=1, max_files=600, per_file=40)
    if len(texts) < 10_000:
        pytest.skip(f"only {len(texts)} gettext messages on this machine (need 10,000)")
    return texts


@pytest.fixture(scope="session")
def parity_texts(real_texts) -> list[str]:
    return real_texts + edge_case_texts()


@pytest.fixture(scope="session", params=[False, True], ids=["gpt2", "prefix_space"])
def bpe(request, tmp_path_factory):
    """(reference tokenizers.Tokenizer, tokenizer.json path, .fb path) of a byte-level BPE
    trained here, offline, with and without add_prefix_space (GPT-2 / RoBERTa style)."""
    pytest.importorskip("tokenizers")
    from image.tokenizer.compile import compile_tokenizer_json

    ref = train_byte_level_bpe(gettext_texts(6000, seed=7, max_files=300, per_file=40), 3000, request.param)
    d = tmp_path_factory.mktemp("bpe")
    ref.save(str(d / "tokenizer.json"))
    (d / "tokenizer.fb").write_bytes(compile_tokenizer_json(d / "tokenizer.json"))
    return ref, str(d / "tokenizer.json"), str(d / "tokenizer.fb")
