"""Real-process fixtures: the runtime as users run it (`python -m edge.boot`)."""

from __future__ import annotations

import os

import pytest

from support.runtime_proc import running_runtime


@pytest.fixture(scope="module")
def ort_runtime(minilm_package, tmp_path_factory):
    with running_runtime(tmp_path_factory.mktemp("ort"), "--package", str(minilm_package), "--engine", "onnxruntime") as rt:
        yield rt


@pytest.fixture(scope="session")
def st_model():
    """sentence-transformers on the shipped model files: the reference embeddings."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    st = pytest.importorskip("sentence_transformers")
    from image.package import source_dir

    return st.SentenceTransformer(str(source_dir()), device="cpu")
