"""Admission of infer requests: the bounds on work accepted and not yet answered.

Two bounds, checked in two places:

* on arrival, in the I/O thread (:meth:`Admission.reserve`): the UTF-8 bytes of texts not yet
  tokenized (``max_pending_text_bytes``), so a flood of large requests is refused at once,
  before any tokenizing, and the memory they hold stays bounded;
* after tokenizing, in the tokenizer stage (:meth:`Admission.admit`): texts and padded tokens
  admitted and not yet answered (``max_queue_requests``, ``max_queue_tokens``), in all and per
  connection. One connection may hold at most its *share* of each bound (:meth:`Admission.share`):
  an equal part counting the connections that hold work plus one more, the next to come. Alone,
  a connection may hold half the queue (an app that pipelines its largest requests is served);
  with 4 holding work each may hold a fifth, so a flood is answered OVERLOADED on its own
  connections while a newcomer still finds room. The share is never less than one request of
  the most texts of the largest bucket (a single connection of a small queue can still fill
  it). The share of texts is checked again before tokenizing (:meth:`Admission.fill`), so a
  flood that resends at once costs no tokenizer time.

Texts are tokenized with the model's maximum as the limit (the tokenizer stops there), so the
bucket of each is known and a text over the maximum is truncated or refused. The I/O thread
releases a request once it is answered, so the counters are shared by two threads: one lock.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from edge.errors import ErrorCode, FlowError, InternalError, RequestError
from edge.serving.request import Request
from edge.serving.scheduler import connection_of
from edge.serving.shapes import BatchShapes

__all__ = ["Admission", "REQUEST_MAX_TEXTS"]

REQUEST_MAX_TEXTS = 64  # the most texts of one infer request (edge.ipc.protocol.Limits.max_texts; a test pins it)


class Admission:
    def __init__(self, tokenizer: Any, shapes: BatchShapes) -> None:
        self.tokenizer = tokenizer
        self.shapes = shapes
        settings = shapes.settings
        self.max_text_tokens = shapes.max_text_tokens  # model maximum (tokens); never above the largest bucket
        self.max_texts = settings.max_queue_requests  # queue bound (texts)
        self.max_queue_tokens = settings.max_queue_tokens  # queue bound (padded tokens)
        self.max_pending_bytes = settings.max_pending_text_bytes  # tokenizer backlog bound (UTF-8 bytes)
        # The least share of a connection: one request of the most texts, all in the largest bucket.
        self.least_share = (REQUEST_MAX_TEXTS, REQUEST_MAX_TEXTS * shapes.buckets[-1])
        self.specials = getattr(tokenizer, "num_special_tokens", 0)  # ids a text gets whatever it holds
        self._lock = threading.Lock()
        self.texts = 0  # texts admitted, not yet answered
        self.queued_tokens = 0  # their padded tokens
        self.pending_bytes = 0  # bytes of texts received, not yet tokenized
        self._held: dict = {}  # connection -> [texts, padded tokens] admitted, not yet answered

    # ------------------------------------------------------------ I/O thread, on arrival

    def reserve(self, text_bytes: int) -> None:
        """Count a request's text bytes against the tokenizer's backlog, or raise OVERLOADED."""
        with self._lock:
            if self.pending_bytes and self.pending_bytes + text_bytes > self.max_pending_bytes:
                raise FlowError(f"tokenizer backlog full ({self.pending_bytes} bytes of text waiting); retry later",
                                ErrorCode.OVERLOADED)
            self.pending_bytes += text_bytes

    # ------------------------------------------------------------ tokenizer stage

    def tokenize(self, texts: list[str], truncate: bool, arrival: float, **fields) -> Request:
        """A :class:`Request` of ``texts`` (``fields``: its deadline, priority, reply address ...)."""
        request = Request([], [], arrival, truncate=truncate, **fields)
        self.fill(request, texts)
        return request

    def fill(self, request: Request, texts: list[str]) -> None:
        """Tokenize ``texts`` into ``request``; raises the request's error (TOO_MANY_TOKENS, EMPTY_TEXT),
        or OVERLOADED, before any tokenizing, when its connection's share of texts is already full."""
        conn = connection_of(request)
        if conn is not None:
            with self._lock:
                texts_held, tokens_held = self._held.get(conn, (0, 0))
                share = self._share(conn)
            if texts_held + len(texts) > share[0] or tokens_held >= share[1]:
                raise self._over_share(texts_held, tokens_held, share)
        ids, buckets, truncated = [], [], []
        for i, text in enumerate(texts):
            enc = self.tokenizer.encode(text, max_length=self.max_text_tokens)
            if enc.truncated and not request.truncate:
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
            bucket = self.shapes.bucket_for(a.size)
            assert bucket is not None  # a.size <= max_text_tokens, which the largest bucket holds
            buckets.append(bucket)
            truncated.append(bool(enc.truncated))
        request.set_tokens(ids, buckets, truncated)

    def admit(self, request: Request) -> bool:
        """Count the request's texts against the queue bound, or raise OVERLOADED. False (nothing
        counted) when the request was answered meanwhile (a drain timed out)."""
        with self._lock:
            if request.released:
                return False
            n = request.texts
            conn = connection_of(request)
            held = self._held.get(conn, [0, 0]) if conn is not None else None
            if held is not None:
                share = self._share(conn)
                if held[0] + n > share[0] or held[1] + request.cost > share[1]:
                    raise self._over_share(held[0], held[1], share)
            if self.texts + n > self.max_texts or self.queued_tokens + request.cost > self.max_queue_tokens:
                raise FlowError(f"queue full ({self.texts} texts, {self.queued_tokens} tokens queued); retry later",
                                ErrorCode.OVERLOADED)
            self.texts += n
            self.queued_tokens += request.cost
            if held is not None:
                held[0] += n
                held[1] += request.cost
                self._held[conn] = held
            request.admitted = True
            return True

    def share(self, conn: Any) -> tuple[int, int]:
        """The texts and padded tokens ``conn`` may hold now (see the module's docstring)."""
        with self._lock:
            return self._share(conn)

    def _share(self, conn: Any) -> tuple[int, int]:
        # Callers hold the lock. The connections holding work, this one included, plus the next.
        parts = len(self._held) + (0 if conn in self._held else 1) + 1
        return (max(self.max_texts // parts, self.least_share[0]),
                max(self.max_queue_tokens // parts, self.least_share[1]))

    def _over_share(self, texts: int, tokens: int, share: tuple[int, int]) -> FlowError:
        return FlowError(f"this connection's share of the queue is full ({texts} texts, {tokens} tokens queued; "
                         f"share {share[0]} texts, {share[1]} tokens, with {len(self._held)} connections "
                         f"holding work); retry after its replies", ErrorCode.OVERLOADED)

    def unreserve(self, text_bytes: int) -> None:
        """The request's texts are tokenized (or refused): they leave the backlog."""
        with self._lock:
            self.pending_bytes -= text_bytes

    # ------------------------------------------------------------ I/O thread, on reply

    def release(self, request: Request) -> None:
        """The request was answered: its texts leave the bound, and it is never admitted after."""
        with self._lock:
            request.released = True
            if request.admitted:
                request.admitted = False
                self.texts -= request.texts
                self.queued_tokens -= request.cost
                conn = connection_of(request)
                held = self._held.get(conn) if conn is not None else None
                if held is not None:
                    held[0] -= request.texts
                    held[1] -= request.cost
                    if held[0] <= 0:
                        del self._held[conn]

    def info(self) -> dict:
        """Counts for the ``queue`` block of health and stats (``edge.ipc.protocol.QueueInfo``)."""
        return {"texts": self.texts, "max_texts": self.max_texts,
                "tokens": self.queued_tokens, "max_queued_tokens": self.max_queue_tokens,
                "pending_text_bytes": self.pending_bytes, "max_pending_text_bytes": self.max_pending_bytes}
