"""Admission of infer requests, on arrival, in the I/O thread.

Texts are tokenized as they arrive, so the bucket of each is known and a text over the model's
maximum is truncated or refused at once; the queue bound (texts and padded tokens admitted but
not yet answered) is checked here, so an overload is answered at once too. The I/O thread is
the only caller, so the counters need no lock.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edge.errors import ErrorCode, FlowError, InternalError, RequestError
from edge.serving.request import Request
from edge.serving.shapes import BatchShapes

__all__ = ["Admission"]


class Admission:
    def __init__(self, tokenizer: Any, shapes: BatchShapes) -> None:
        self.tokenizer = tokenizer
        self.shapes = shapes
        self.max_text_tokens = shapes.max_text_tokens  # model maximum (tokens); never above the largest bucket
        self.max_texts = shapes.settings.max_queue_requests  # queue bound (texts)
        self.max_queue_tokens = shapes.settings.max_queue_tokens  # queue bound (padded tokens)
        self.specials = getattr(tokenizer, "num_special_tokens", 0)  # ids a text gets whatever it holds
        self.texts = 0  # texts admitted, not yet answered
        self.queued_tokens = 0  # their padded tokens

    def tokenize(self, texts: list[str], truncate: bool, arrival: float, **fields) -> Request:
        """A :class:`Request` of ``texts`` (``fields``: its deadline, priority, reply address ...)."""
        ids, buckets, truncated = [], [], []
        for i, text in enumerate(texts):
            enc = self.tokenizer.encode(text, max_length=self.max_text_tokens)
            if enc.truncated and not truncate:
                raise RequestError(f"texts[{i}] is longer than {self.max_text_tokens} tokens and truncate=false",
                                   ErrorCode.TOO_MANY_TOKENS)
            a = np.asarray(enc.ids, dtype=np.int64)  # (n,)
            if a.size <= self.specials:  # only characters the normalizer removes (U+200B, controls, marks)
                raise RequestError(f"texts[{i}] has nothing to embed: its characters are all invisible or "
                                   f"control characters", ErrorCode.EMPTY_TEXT)
            if not 0 < a.size <= self.max_text_tokens:
                raise InternalError(f"tokenizer returned {a.size} ids for texts[{i}] "
                                    f"(max_length {self.max_text_tokens})")
            ids.append(a)
            buckets.append(self.shapes.bucket_for(a.size))
            truncated.append(bool(enc.truncated))
        return Request(ids, buckets, arrival, truncated=truncated, **fields)

    def admit(self, request: Request) -> None:
        """Count the request's texts against the bound, or raise OVERLOADED."""
        n = request.texts
        if self.texts + n > self.max_texts or self.queued_tokens + request.cost > self.max_queue_tokens:
            raise FlowError(f"queue full ({self.texts} texts, {self.queued_tokens} tokens queued); retry later",
                            ErrorCode.OVERLOADED)
        self.texts += n
        self.queued_tokens += request.cost

    def release(self, request: Request) -> None:
        """The request was answered: its texts leave the bound."""
        self.texts -= request.texts
        self.queued_tokens -= request.cost

    def info(self) -> dict:
        """Counts for the ``queue`` block of health and stats (``edge.ipc.protocol.QueueInfo``)."""
        return {"texts": self.texts, "max_texts": self.max_texts,
                "tokens": self.queued_tokens, "max_queued_tokens": self.max_queue_tokens}
