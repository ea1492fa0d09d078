"""Fixtures of the tokenizer build-side tests (compile, prune, CLI)."""

from __future__ import annotations

import pytest

from image.tokenizer.samples import gettext_texts


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> str:
    """4,000 real gettext sentences, one per line."""
    texts = gettext_texts(4000, seed=3, max_files=300, per_file=40)
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(" ".join(t.split()) for t in texts) + "\n", encoding="utf-8")
    return str(path)
