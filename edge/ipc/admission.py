"""Admission of infer requests, on arrival, in the I/O thread.

Texts are tokenized as they arrive, so the bucket of each is known and a text
over the model's maximum is truncated or refused at once; the queue bound
(texts and padded tokens admitted but not yet answered) is checked here, so an
overload is answered at once too. The I/O thread is the only caller.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edge.errors import ErrorCode, FlowError, InternalError, RequestError

__all__ = ["Admission", "Tokenized"]


class Tokenized:
    __slots__ = ("ids", "tokens", "buckets", "truncated", "cost")

    def __init__(self) -> None:
        self.ids: list[np.ndarray] = []  # (n,) int64 per text, special tokens included
        self.tokens: list[int] = []  # n per text
        self.buckets: list[int] = []  # bucket per text (tokens)
        self.truncated: list[bool] = []
        self.cost = 0  # padded tokens: sum of the buckets


class Admission:
    def __init__(self, tokenizer: Any, buckets: list[int], max_tokens: int, max_texts: int, max_queue_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens  # model maximum (tokens); never above the largest bucket
        self.max_texts = max_texts  # queue bound (texts)
        self.max_queue_tokens = max_queue_tokens  # queue bound (padded tokens)
        self.texts = 0  # texts admitted, not yet answered
        self.queued_tokens = 0  # their padded tokens
        sizes = sorted(buckets)
        # bucket of a text by its token count, computed once: index n -> smallest bucket >= n
        self._bucket_of = [next(b for b in sizes if b >= n) for n in range(max_tokens + 1)]

    def tokenize(self, texts: list[str], truncate: bool) -> Tokenized:
        t = Tokenized()
        for i, text in enumerate(texts):
            enc = self.tokenizer.encode(text, max_length=self.max_tokens)
            if enc.truncated and not truncate:
                raise RequestError(
                    f"texts[{i}] is longer than {self.max_tokens} tokens and truncate=false", ErrorCode.TOO_MANY_TOKENS
                )
            a = np.asarray(enc.ids, dtype=np.int64)  # (n,)
            if not 0 < a.size <= self.max_tokens:
                raise InternalError(f"tokenizer returned {a.size} ids for texts[{i}] (max_length {self.max_tokens})")
            t.ids.append(a)
            t.tokens.append(int(a.size))
            t.buckets.append(self._bucket_of[a.size])
            t.truncated.append(bool(enc.truncated))
        t.cost = sum(t.buckets)
        return t

    def admit(self, t: Tokenized) -> None:
        """Count the texts against the bound, or raise OVERLOADED."""
        n = len(t.ids)
        if self.texts + n > self.max_texts or self.queued_tokens + t.cost > self.max_queue_tokens:
            raise FlowError(
                f"queue full ({self.texts} texts, {self.queued_tokens} tokens queued); retry later", ErrorCode.OVERLOADED
            )
        self.texts += n
        self.queued_tokens += t.cost

    def release(self, n_texts: int, cost: int) -> None:
        self.texts -= n_texts
        self.queued_tokens -= cost

    def info(self) -> dict:
        return {"requests": self.texts, "tokens": self.queued_tokens, "max_requests": self.max_texts,
                "max_tokens": self.max_queue_tokens}
