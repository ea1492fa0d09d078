"""The engines' parity against sentence-transformers: its sentences and its tolerance, for the
tests of every folder (tests/engines, tests/image, the self-test gate of tests/integration).

The sentences' module is tests/engines/sentences.py: image/quantize.py reads that file (an int8
build measures its model on these sentences, and tests/conftest.py keys the int8 package on it),
so it stays there, and this module loads it by path, once, as ``support._engine_sentences``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

COSINE_MIN = 0.9999  # per row, an engine's embedding against sentence-transformers'
ABS_MAX = 1e-4  # per element

SENTENCES = Path(__file__).resolve().parents[1] / "engines" / "sentences.py"

_NAME = "support._engine_sentences"
_spec = importlib.util.spec_from_file_location(_NAME, SENTENCES)
_module = importlib.util.module_from_spec(_spec)
sys.modules[_NAME] = _module  # before it runs, as an import would do
_spec.loader.exec_module(_module)

BASE = _module.BASE
WORDS = _module.WORDS
parity_sentences = _module.parity_sentences
pad_batch = _module.pad_batch
bucket_for = _module.bucket_for
