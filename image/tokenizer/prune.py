"""Prune a tokenizer's vocabulary to what a domain corpus uses.

    from image.tokenizer.prune import prune_tokenizer
    result = prune_tokenizer("tokenizer.json", ["corpus.txt"])
    result.fb_bytes, result.new_to_old, result.report

Kept: the tokens the corpus's training share uses, plus what keeps every input
tokenizable as before wherever it can: the special and added tokens, the unknown
and padding tokens, every single-character token and (WordPiece) every
continuation piece of one character, and (BPE) every token a kept token can be
merged from, so a word whose tokens were all kept is merged the same way.
New ids keep the original order; the ``.fb`` carries the map new id -> original
id (``original_ids``), and the package builder slices the embedding rows with it.

Each line of a corpus file is one text. Every ``round(1 / held_out)``-th line is
held out: the report gives the share of those texts whose ids are unchanged
(pruned ids mapped back equal the original ids).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from edge.errors import ErrorCode, TokenizerError
from edge.preload.tokenizer import Tokenizer
from edge.preload.tokenizer_fb.ModelKind import ModelKind
from image.tokenizer.compile import spec_from_json
from image.tokenizer.spec import AddedTokenSpec, TokenizerSpec, spec_from_fb, to_fb

__all__ = ["PruneResult", "prune_tokenizer", "read_corpus", "load_spec"]


@dataclass
class PruneResult:
    fb_bytes: bytes
    new_to_old: np.ndarray  # (V_new,) int64: id in the original vocabulary of each new id
    report: dict


def load_spec(path: str | Path) -> tuple[TokenizerSpec, bytes]:
    """Spec and ``.fb`` bytes of a tokenizer.json or a compiled ``.fb``."""
    raw = Path(path).read_bytes()
    if raw[4:8] == b"EDTK":
        return spec_from_fb(raw), raw
    import hashlib

    try:
        data = json.loads(raw)
    except ValueError as e:
        raise TokenizerError(f"{path}: neither a compiled tokenizer nor JSON ({e})", ErrorCode.TOKENIZER_INVALID) from e
    spec = spec_from_json(data, hashlib.sha256(raw).hexdigest())
    return spec, to_fb(spec)


def read_corpus(paths: list[str | Path]) -> list[str]:
    """Non-empty lines of the corpus files, without their line ends."""
    texts: list[str] = []
    for p in paths:
        with open(p, encoding="utf-8", errors="replace") as f:
            texts.extend(line.rstrip("\r\n") for line in f)
    return [t for t in texts if t.strip()]


def _keep_set(spec: TokenizerSpec, used: set[int]) -> set[int]:
    keep = set(used)
    keep.update(t.id for t in spec.added_tokens)
    keep.update(spec.prefix_ids)
    keep.update(spec.suffix_ids)
    keep.update(i for i in (spec.unk_id, spec.pad_id) if 0 <= i < len(spec.vocab))
    prefix = spec.continuing_subword_prefix if spec.model == ModelKind.WordPiece else ""
    for i, tok in enumerate(spec.vocab):
        if len(tok) == 1 or (prefix and tok.startswith(prefix) and len(tok) == len(prefix) + 1):
            keep.add(i)
    if spec.model == ModelKind.BPE:
        producers: dict[int, list[tuple[int, int]]] = {}
        for a, b, r in spec.merges:
            producers.setdefault(r, []).append((a, b))
        stack = list(keep)
        while stack:
            for a, b in producers.get(stack.pop(), ()):
                for x in (a, b):
                    if x not in keep:
                        keep.add(x)
                        stack.append(x)
    return keep


def _pruned_spec(spec: TokenizerSpec, new_to_old: list[int]) -> TokenizerSpec:
    old_to_new = {o: n for n, o in enumerate(new_to_old)}
    remap = lambda ids: [old_to_new[i] for i in ids]  # noqa: E731
    base = spec.original_ids  # pruning a pruned tokenizer: map all the way back
    return replace(
        spec,
        vocab=[spec.vocab[o] for o in new_to_old],
        unk_id=old_to_new.get(spec.unk_id, -1),
        pad_id=old_to_new.get(spec.pad_id, 0),
        merges=[
            (old_to_new[a], old_to_new[b], old_to_new[r])
            for a, b, r in spec.merges
            if a in old_to_new and b in old_to_new and r in old_to_new
        ],
        added_tokens=[replace(t, id=old_to_new[t.id]) for t in spec.added_tokens if isinstance(t, AddedTokenSpec)],
        prefix_ids=remap(spec.prefix_ids),
        suffix_ids=remap(spec.suffix_ids),
        original_ids=[base[o] for o in new_to_old] if base is not None else list(new_to_old),
        original_vocab_size=spec.original_vocab_size or len(spec.vocab),
    )


def prune_tokenizer(
    tokenizer: str | Path,
    corpus: list[str | Path],
    *,
    held_out: float = 0.1,
) -> PruneResult:
    """Prune ``tokenizer`` (tokenizer.json or .fb) to the corpus; see the module docstring."""
    if not 0.0 <= held_out < 1.0:
        raise ValueError(f"held_out must be in [0, 1), got {held_out}")
    spec, before = load_spec(tokenizer)
    texts = read_corpus(corpus)
    every = round(1 / held_out) if held_out > 0 else 0
    held = [t for i, t in enumerate(texts) if every and i % every == every - 1]
    train = [t for i, t in enumerate(texts) if not (every and i % every == every - 1)]
    original = Tokenizer.from_bytes(before)
    used: set[int] = set()
    for t in train:
        used.update(original.tokenize(t))
    new_to_old = sorted(_keep_set(spec, used))
    pruned_spec = _pruned_spec(spec, new_to_old)
    after = to_fb(pruned_spec)
    pruned = Tokenizer.from_bytes(after)
    # to the ids of the original vocabulary (through an earlier pruning, if any): the rows of
    # the source model's embedding matrix
    n2o = np.asarray(pruned_spec.original_ids, dtype=np.int64)
    unchanged = sum(
        1 for t in held if [new_to_old[i] for i in pruned.tokenize(t)] == original.tokenize(t)
    )  # fmt: skip
    report = {
        "tokens_kept": len(new_to_old),
        "tokens_total": len(spec.vocab),
        "tokens_used_by_corpus": len(used),
        "bytes_before": len(before),
        "bytes_after": len(after),
        "corpus_texts": len(texts),
        "train_texts": len(train),
        "held_out_texts": len(held),
        "held_out_unchanged": (unchanged / len(held)) if held else None,
    }
    return PruneResult(after, n2o, report)


def format_report(report: dict) -> str:
    r = report
    lines = [
        f"tokens kept: {r['tokens_kept']} of {r['tokens_total']} "
        f"({100 * r['tokens_kept'] / max(r['tokens_total'], 1):.1f} %; {r['tokens_used_by_corpus']} used by the corpus)",
        f"bytes: {r['bytes_before']} before, {r['bytes_after']} after "
        f"({100 * r['bytes_after'] / max(r['bytes_before'], 1):.1f} %)",
    ]
    if r["held_out_unchanged"] is None:
        lines.append(f"held-out texts: none of {r['corpus_texts']} (held_out=0)")
    else:
        lines.append(
            f"held-out texts with unchanged ids: {100 * r['held_out_unchanged']:.2f} % "
            f"of {r['held_out_texts']} (trained on {r['train_texts']})"
        )
    return "\n".join(lines)
