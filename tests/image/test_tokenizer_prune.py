"""Pruning: what is kept, the id map, the report, and embeddings of a pruned model."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from edge.preload.tokenizer import Tokenizer
from image.tokenizer.prune import prune_tokenizer, read_corpus
from image.tokenizer.samples import gettext_texts, train_byte_level_bpe


@pytest.fixture(scope="module")
def pruned_minilm(minilm_json, corpus_file):
    return prune_tokenizer(minilm_json, [corpus_file], held_out=0.1)


@pytest.fixture(scope="module")
def unseen_texts() -> list[str]:
    return gettext_texts(1500, seed=11, max_files=200, per_file=20)


def _check_map_back(original: Tokenizer, pruned: Tokenizer, n2o: np.ndarray, texts: list[str]) -> tuple[int, int]:
    """Whenever every original token was kept, the pruned ids map back to the original ids."""
    kept = set(n2o.tolist())
    covered = unchanged = 0
    for text in texts:
        want = original.encode(text).ids
        got = n2o[pruned.encode(text).ids].tolist()
        if set(want) <= kept:
            covered += 1
            assert got == want, text
        unchanged += got == want
    return covered, unchanged


def test_minilm_prune(minilm_json, corpus_file, pruned_minilm, unseen_texts):
    r = pruned_minilm
    rep = r.report
    assert rep["tokens_total"] == 30522
    assert rep["tokens_used_by_corpus"] < rep["tokens_kept"] < rep["tokens_total"]
    assert rep["bytes_after"] < rep["bytes_before"] and len(r.fb_bytes) == rep["bytes_after"]
    assert rep["held_out_texts"] == len(read_corpus([corpus_file])) // 10
    assert 0.5 < rep["held_out_unchanged"] <= 1.0
    assert r.new_to_old.dtype == np.int64 and np.all(np.diff(r.new_to_old) > 0)

    from image.tokenizer.compile import compile_tokenizer_json

    original = Tokenizer.from_bytes(compile_tokenizer_json(minilm_json))
    pruned = Tokenizer.from_bytes(r.fb_bytes)
    assert pruned.vocab_size == rep["tokens_kept"]
    assert pruned.original_ids.tolist() == r.new_to_old.tolist()
    kept_tokens = {original.id_to_token(i) for i in r.new_to_old}
    for special in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"):
        assert special in kept_tokens
    for i in range(original.vocab_size):  # every single character and continuation piece
        tok = original.id_to_token(i)
        if len(tok) == 1 or (tok.startswith("##") and len(tok) == 3):
            assert tok in kept_tokens

    train = [t for i, t in enumerate(read_corpus([corpus_file])) if i % 10 != 9]
    covered, unchanged = _check_map_back(original, pruned, r.new_to_old, train[:1500])
    assert covered == unchanged == 1500  # the texts it was pruned for never change
    covered, _ = _check_map_back(original, pruned, r.new_to_old, unseen_texts)
    assert covered > 100
    # inputs outside the corpus still tokenize, without unknowns the original did not have
    unk = pruned.token_to_id("[UNK]")
    for text in unseen_texts[:300]:
        assert pruned.encode(text).ids.count(unk) == original.encode(text).ids.count(original.token_to_id("[UNK]"))


def test_bpe_prune_keeps_merge_chains(tmp_path, unseen_texts):
    texts = gettext_texts(3000, seed=5, max_files=200, per_file=30)
    ref = train_byte_level_bpe(texts, 3000)
    ref.save(str(tmp_path / "bpe.json"))
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(" ".join(t.split()) for t in texts[:300]) + "\n", encoding="utf-8")
    r = prune_tokenizer(tmp_path / "bpe.json", [corpus], held_out=0.2)
    assert r.report["tokens_kept"] < r.report["tokens_total"]
    from image.tokenizer.compile import compile_tokenizer_json

    original = Tokenizer.from_bytes(compile_tokenizer_json(tmp_path / "bpe.json"))
    pruned = Tokenizer.from_bytes(r.fb_bytes)
    covered, unchanged = _check_map_back(original, pruned, r.new_to_old, texts[300:2000] + unseen_texts)
    assert covered > 50
    assert r.report["held_out_unchanged"] > 0.0


def test_prune_a_pruned_fb_composes_the_map(tmp_path, minilm_json, corpus_file, pruned_minilm):
    first = tmp_path / "first.fb"
    first.write_bytes(pruned_minilm.fb_bytes)
    lines = read_corpus([corpus_file])[:500]
    small = tmp_path / "small.txt"
    small.write_text("\n".join(lines) + "\n", encoding="utf-8")
    second = prune_tokenizer(first, [small], held_out=0.0)
    assert second.report["tokens_kept"] < pruned_minilm.report["tokens_kept"]
    tok1, tok2 = Tokenizer.open(first), Tokenizer.from_bytes(second.fb_bytes)
    assert tok2.original_ids.tolist() == second.new_to_old.tolist()
    assert set(second.new_to_old.tolist()) <= set(pruned_minilm.new_to_old.tolist())
    for text in lines:  # all of them were its corpus: unchanged, mapped to the very original ids
        assert tok2.original_ids[tok2.encode(text).ids].tolist() == tok1.original_ids[tok1.encode(text).ids].tolist()


def test_cli_prune_prints_report(tmp_path, minilm_json, corpus_file):
    out = tmp_path / "p.fb"
    r = subprocess.run([sys.executable, "-m", "image.tokenizer.cli", "prune", minilm_json, "--corpus", corpus_file,
                        "--out", str(out), "--report-json", str(tmp_path / "r.json")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "tokens kept:" in r.stdout and "held-out texts with unchanged ids:" in r.stdout
    assert Tokenizer.open(out).original_ids is not None


def test_pruned_embeddings_match(minilm_json, pruned_minilm, unseen_texts, corpus_file):
    """Embedding rows sliced with new_to_old give the same sentence embeddings
    wherever the tokenization is unchanged (cosine >= 0.9999)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from pathlib import Path

    model_dir = Path(minilm_json).parent
    model = transformers.AutoModel.from_pretrained(model_dir).eval()
    pruned_model = transformers.AutoModel.from_pretrained(model_dir).eval()
    n2o = torch.from_numpy(pruned_minilm.new_to_old)
    weight = model.embeddings.word_embeddings.weight.detach()[n2o].clone()
    pruned_model.embeddings.word_embeddings = torch.nn.Embedding.from_pretrained(weight)
    assert pruned_model.embeddings.word_embeddings.weight.shape[0] == pruned_minilm.report["tokens_kept"]

    from image.tokenizer.compile import compile_tokenizer_json

    original = Tokenizer.from_bytes(compile_tokenizer_json(minilm_json))
    pruned = Tokenizer.from_bytes(pruned_minilm.fb_bytes)
    texts = [t for t in read_corpus([corpus_file])[:48] + unseen_texts[:48]]

    def embed(m, tok):
        b = tok.encode_batch(texts, length=128)
        ids, mask = torch.from_numpy(b.input_ids), torch.from_numpy(b.attention_mask)
        with torch.no_grad():
            h = m(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, T, 384)
        e = (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)  # (B, 384) mean pooling
        return torch.nn.functional.normalize(e, dim=-1), b

    e0, b0 = embed(model, original)
    e1, b1 = embed(pruned_model, pruned)
    same = [i for i in range(len(texts)) if n2o[b1.input_ids[i, : b1.token_counts[i]]].tolist()
            == b0.input_ids[i, : b0.token_counts[i]].tolist()]
    assert len(same) >= 60
    cos = (e0[same] * e1[same]).sum(-1)
    assert float(cos.min()) >= 0.9999
