"""The tokenizer compiler: refusals by component name, determinism, the CLI."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from edge.errors import ErrorCode, TokenizerError
from image.tokenizer.compile import compile_tokenizer_json, spec_from_json

tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def minilm(minilm_json) -> dict:
    return json.load(open(minilm_json, encoding="utf-8"))


def _mutated(base: dict, path: list, value) -> dict:
    data = copy.deepcopy(base)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


@pytest.mark.parametrize(
    "path, value, name",
    [
        (["normalizer"], {"type": "NFKC"}, "normalizer 'NFKC'"),
        (["normalizer"], {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "Lowercase"}]}, "normalizer 'Sequence'"),
        (["pre_tokenizer"], {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}, "pre_tokenizer 'Metaspace'"),
        (["pre_tokenizer"], {"type": "Whitespace"}, "pre_tokenizer 'Whitespace'"),
        (["pre_tokenizer"], {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}, "use_regex=false"),
        (["model", "type"], "Unigram", "model 'Unigram'"),
        (["post_processor"], {"type": "Sequence", "processors": []}, "post_processor 'Sequence'"),
        (["added_tokens", 0, "normalized"], True, "added token '[PAD]' with normalized=true"),
        (["added_tokens", 0, "single_word"], True, "added token '[PAD]' with single_word=true"),
        (["truncation", "strategy"], "OnlySecond", "truncation strategy 'OnlySecond'"),
    ],
)
def test_unsupported_components_are_named(minilm, path, value, name):
    with pytest.raises(TokenizerError) as err:
        spec_from_json(_mutated(minilm, path, value))
    assert err.value.code == ErrorCode.TOKENIZER_UNSUPPORTED
    assert name in str(err.value)


def test_real_unigram_tokenizer_is_refused(tmp_path):
    """A SentencePiece-style tokenizer trained by tokenizers itself (Metaspace + Unigram)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(["a small corpus of words", "for a unigram model"] * 50,
                            trainers.UnigramTrainer(vocab_size=40, show_progress=False))
    tok.save(str(tmp_path / "unigram.json"))
    with pytest.raises(TokenizerError) as err:
        compile_tokenizer_json(tmp_path / "unigram.json")
    assert err.value.code == ErrorCode.TOKENIZER_UNSUPPORTED
    assert "Metaspace" in str(err.value)
    data = json.load(open(tmp_path / "unigram.json"))
    data["pre_tokenizer"] = {"type": "BertPreTokenizer"}
    with pytest.raises(TokenizerError, match="model 'Unigram'"):
        spec_from_json(data)


def test_bpe_dropout_is_refused(tmp_path):
    from image.tokenizer.samples import train_byte_level_bpe

    data = json.loads(train_byte_level_bpe(["some text to train on"] * 20, 300).to_str())
    data["model"]["dropout"] = 0.1
    with pytest.raises(TokenizerError, match="dropout"):
        spec_from_json(data)


def test_not_json_is_invalid(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("{not json")
    with pytest.raises(TokenizerError) as err:
        compile_tokenizer_json(path)
    assert err.value.code == ErrorCode.TOKENIZER_INVALID


def test_compile_is_deterministic(minilm_json):
    assert compile_tokenizer_json(minilm_json) == compile_tokenizer_json(minilm_json)


def _cli(*args, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "image.tokenizer.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_cli_compile_and_encode_match_reference(tmp_path, minilm_json):
    out = tmp_path / "t.fb"
    r = _cli("compile", minilm_json, "--out", str(out))
    assert r.returncode == 0, r.stderr
    texts = ["Hello, world!", "", "naïve café 中文", "x" * 300, "[CLS] inside"]
    r = _cli("encode", "--tokenizer", str(out), "--max-length", "16",
             stdin="".join(json.dumps(t) + "\n" for t in texts))
    assert r.returncode == 0, r.stderr
    ref = tokenizers.Tokenizer.from_file(minilm_json)
    ref.no_padding()
    ref.enable_truncation(16)
    assert [json.loads(line) for line in r.stdout.splitlines()] == [e.ids for e in ref.encode_batch(texts)]


def test_cli_refuses_unsupported_and_bad_input(tmp_path, minilm, minilm_json):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_mutated(minilm, ["pre_tokenizer"], {"type": "Metaspace"})))
    r = _cli("compile", str(bad), "--out", str(tmp_path / "x.fb"))
    assert r.returncode == 1 and "Metaspace" in r.stderr and "4011" in r.stderr
    assert not (tmp_path / "x.fb").exists()
    out = tmp_path / "t.fb"
    assert _cli("compile", minilm_json, "--out", str(out)).returncode == 0
    r = _cli("encode", "--tokenizer", str(out), stdin='{"text": 1}\n')
    assert r.returncode == 2 and "expected a JSON string" in r.stderr
