"""Test doubles for the in-process serving tests: a whitespace tokenizer and a numpy engine.

They implement the Tokenizer and Engine protocols of docs/architecture.md and
nothing more; the real engines and tokenizer are tested against the server by
the real-process tests.
"""

from __future__ import annotations

import threading
import time
import zlib
from dataclasses import dataclass

import numpy as np

PAD, CLS, SEP = 0, 1, 2
VOCAB = 1000
# The serving settings and sequence length of the fake runtimes the ipc tests start (make_server).
SERVING = {
    "buckets": [8, 16, 32, 64],  # tokens
    "max_batch_size": 8,  # texts
    "max_batch_tokens": 256,  # padded tokens: the 64 bucket holds 4 rows
    "max_delay_ms": 2.0,
    "max_queue_requests": 64,  # texts
    "max_queue_tokens": 4096,  # padded tokens
}
MAX_SEQ = 64
DIM = 8


@dataclass
class Encoding:
    ids: list
    truncated: bool


class FakeTokenizer:
    """Whitespace split; each word -> 3 + crc32(word) % (VOCAB - 3); [CLS] ... [SEP]."""

    pad_id = PAD
    vocab_size = VOCAB
    model_max_length = None
    original_ids = None

    def encode(self, text: str, max_length: int | None = None) -> Encoding:
        ids = [CLS] + [3 + zlib.crc32(w.encode("utf-8", "surrogatepass")) % (VOCAB - 3) for w in text.split()] + [SEP]
        truncated = max_length is not None and len(ids) > max_length
        if truncated:
            ids = ids[: max_length - 1] + [SEP]
        return Encoding(ids, truncated)


def text_of_tokens(n: int, word: str = "w") -> str:
    """A text that the fake tokenizer turns into exactly ``n`` ids (n >= 3: CLS, words, SEP)."""
    assert n >= 3
    return " ".join(f"{word}{i}" for i in range(n - 2))


_W = np.random.default_rng(1234).standard_normal((VOCAB, DIM)).astype(np.float32)


def expected_embedding(ids) -> np.ndarray:
    """What FakeEngine returns for one unpadded row of ids: normalised mean of W rows."""
    v = _W[np.asarray(ids)].mean(axis=0)
    return (v / np.linalg.norm(v)).astype(np.float32)


class FakeEngine:
    """embedding = normalised mean of a fixed random table over the unmasked ids.

    Records each call's shape and checks the padding contract (pad ids where the
    mask is 0); ``sleep_s`` simulates compute, ``fail_on`` makes run() raise when
    a row contains that token id.
    """

    name = "fake"
    device = "cpu"

    def __init__(self, sleep_s: float = 0.0, fail_on: int | None = None) -> None:
        self.sleep_s = sleep_s
        self.fail_on = fail_on
        self.calls: list[tuple[int, int]] = []  # (rows, tokens) of each run: the bucket's, or the longest text's on a CPU
        self.padding_violations = 0
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.release.set()  # clear() to hold run() until set() again
        self.running = threading.Event()  # set when run() is entered

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        assert input_ids.dtype == np.int64 and attention_mask.dtype == np.int64
        assert input_ids.shape == attention_mask.shape
        # An engine takes the arrays' memory as it lies (ORT's C API): rows must be contiguous.
        assert input_ids.flags.c_contiguous and attention_mask.flags.c_contiguous
        self.running.set()
        self.release.wait(30.0)
        if self.sleep_s:
            time.sleep(self.sleep_s)
        with self.lock:
            self.calls.append(tuple(input_ids.shape))
            if np.any(input_ids[attention_mask == 0] != PAD):
                self.padding_violations += 1
        if self.fail_on is not None and np.any(input_ids == self.fail_on):
            raise RuntimeError("injected engine failure")
        m = attention_mask.astype(np.float32)[..., None]  # (B, T, 1)
        v = (_W[input_ids] * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1.0)  # (B, D)
        return (v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)).astype(np.float32)
