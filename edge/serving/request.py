"""One record per request, and the small typed messages the serving threads exchange.

A :class:`Request` is created by the I/O thread when an ``infer`` message is admitted and lives
until its one reply is sent. It carries everything about the request (one record, as
text-embeddings-inference's queue ``Entry`` is; docs/design.md, "Ownership"): where to reply,
the trace id, the tokens and bucket of each text, the deadline and priority, and, filled by
the engine loop, the outputs and the timings.

Who writes which fields (each field has one writer thread)::

    I/O thread, on arrival               reply_to, trace_id, request_id, key, arrival, deadline,
                                         priority, texts_in, n_texts, text_bytes, truncate
    tokenizer stage, before Admit        ids, tokens, buckets, truncated, cost, parts (set_tokens),
                                         texts_in (dropped), finished (only if never admitted)
    admission, under its lock            admitted, released
    engine loop (and its scheduler)      seq, eff_deadline, idle_arrival, Part.queued, remaining,
                                         finished, out, queue_ms, compute_ms, last_batch, enqueued,
                                         done, batches, degraded

The monotonic stamps ``arrival``, ``enqueued`` and ``done`` (with ``compute_ms`` and the reply's
time) split a request's time into the journal's phases: load, transfer, forward, post
(:func:`phases_ms`; docs/trace.md).

The I/O thread reads the engine loop's fields only after the loop has handed the request back
in a :class:`Finished` message; the deque the message travels through orders the writes.
Whether a request has been *answered* is the I/O thread's alone: its table of requests in flight.

Messages, I/O thread -> tokenizer stage: the request itself, :class:`Cancel`; tokenizer stage ->
engine loop: :class:`Admit`, :class:`Cancel` (in the order they came, so a cancel never
overtakes its request).
Engine loop -> I/O thread (its outbox): :class:`Finished`, :class:`Failed`, :class:`CancelOutcome`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Part", "Request", "Admit", "Cancel", "Finished", "Failed", "CancelOutcome", "phases_ms"]


class Part:
    """One text of a request: its token ids and the bucket they were queued in."""

    __slots__ = ("request", "index", "ids", "bucket", "queued")

    def __init__(self, request: "Request", index: int, ids: Any, bucket: int) -> None:
        self.request = request
        self.index = index  # position of the text in the request
        self.ids = ids  # (n,) int64 with special tokens, n <= bucket
        self.bucket = bucket  # tokens
        self.queued = False  # in a scheduler queue (engine loop only)

    @property
    def arrival(self) -> float:
        return self.request.arrival


class Request:
    """An infer request from admission to its reply (see the module docstring for owners)."""

    __slots__ = (
        # I/O thread, set before the request is handed over
        "reply_to", "trace_id", "request_id", "key", "arrival", "deadline", "priority",
        "texts_in", "n_texts", "text_bytes", "truncate",
        # tokenizer stage (set_tokens), then admission
        "ids", "tokens", "buckets", "truncated", "cost", "parts", "admitted", "released",
        # engine loop
        "seq", "eff_deadline", "idle_arrival", "remaining", "finished", "out", "queue_ms", "compute_ms",
        "last_batch", "enqueued", "done", "batches", "degraded",
    )

    def __init__(self, ids: list, buckets: list[int], arrival: float, *, deadline: float | None = None,
                 priority: int = 1, reply_to: Any = None, trace_id: str = "", request_id: Any = None,
                 key: Any = None, truncated: list[bool] | None = None, texts_in: list[str] | None = None,
                 text_bytes: int = 0, truncate: bool = True) -> None:
        self.reply_to = reply_to  # the transport's return address (opaque here)
        self.trace_id = trace_id  # 16 hex digits, in the reply and every log line about this request
        self.request_id = request_id  # the client's id, or None
        self.key = key  # the transport's key of this request in its table of requests in flight
        self.arrival = arrival  # monotonic s, stamped on arrival at the socket
        self.deadline = deadline  # monotonic s, or None
        self.priority = priority  # 0 first .. 2 last
        self.texts_in = texts_in  # the texts, until the tokenizer stage has their ids
        self.n_texts = len(texts_in) if texts_in is not None else len(ids)  # texts received (the journal's)
        self.text_bytes = text_bytes  # their UTF-8 bytes, counted against the tokenizer's backlog bound
        self.truncate = truncate  # False: a text over the model's maximum is refused
        self.admitted = False  # counted against the queue bound (admission)
        self.released = False  # answered: out of the queue bound for good (admission)
        self.set_tokens(ids, buckets, truncated)
        self.seq = 0  # arrival order in the scheduler
        self.eff_deadline = math.inf  # deadline, or arrival + default; the scheduler's ordering key
        self.idle_arrival = False  # arrived when no batch was running: dispatch at once
        self.finished = False  # every text ran, or the request was dropped: its other parts are ignored
        self.out: np.ndarray | None = None  # (N, D) float32, allocated by the engine loop
        self.queue_ms = 0.0  # longest wait of any text before its batch ran (ms)
        self.compute_ms = 0.0  # sum of the engine times of the batches it was in (ms)
        self.last_batch = -1  # number of the last batch it was in (counts compute_ms once per batch)
        self.enqueued: float | None = None  # monotonic s: the engine loop took it in (tokenized, admitted)
        self.done: float | None = None  # monotonic s: the end of the last batch it ran in
        self.batches: list = []  # [batch number, texts in that batch] of each batch it ran in
        self.degraded = False  # served by a fallback (the circuit breaker sets it; replies say so)

    def set_tokens(self, ids: list, buckets: list[int], truncated: list[bool] | None = None) -> None:
        """The ids and bucket of each text (the tokenizer stage, before the request is admitted)."""
        self.ids = ids  # per text: (n,) int64
        self.tokens = [len(a) for a in ids]  # per text: n, specials included
        self.buckets = list(buckets)  # per text: bucket (tokens)
        self.truncated = list(truncated) if truncated is not None else [False] * len(ids)
        self.cost = sum(self.buckets)  # padded tokens counted against the queue bound
        self.parts = [Part(self, i, a, b) for i, (a, b) in enumerate(zip(ids, buckets))]
        self.remaining = len(self.parts)  # texts not yet run (engine loop after this)

    @property
    def texts(self) -> int:
        return len(self.parts)


class Admit:
    """Queue ``request`` for the engine."""

    __slots__ = ("request",)

    def __init__(self, request: Request) -> None:
        self.request = request


class Cancel:
    """Drop ``target`` if it has not finished; answer ``reply_to`` (the cancel message's address)."""

    __slots__ = ("target", "reply_to")

    def __init__(self, target: Request, reply_to: Any) -> None:
        self.target, self.reply_to = target, reply_to


class Finished:
    """Every text of ``request`` ran; its ``out``, ``queue_ms`` and ``compute_ms`` are final."""

    __slots__ = ("request",)

    def __init__(self, request: Request) -> None:
        self.request = request


class Failed:
    """``request`` ends with error ``code`` (expired, cancelled, engine failure)."""

    __slots__ = ("request", "code", "message")

    def __init__(self, request: Request, code: Any, message: str) -> None:
        self.request, self.code, self.message = request, code, message


class CancelOutcome:
    """The answer to a :class:`Cancel`: was ``target`` still queued or running when it came."""

    __slots__ = ("reply_to", "target", "cancelled")

    def __init__(self, reply_to: Any, target: Request, cancelled: bool) -> None:
        self.reply_to, self.target, self.cancelled = reply_to, target, cancelled


def phases_ms(received: float, enqueued: float | None, done: float | None, compute_ms: float,
              replied: float) -> list:
    """[load, transfer, forward, post, total] in ms from the request's monotonic stamps (s); a
    phase whose stamps are missing (refused before the engine, expired in the queue) is None.
    They add up: load + transfer + forward + post = total."""
    total = (replied - received) * 1000.0
    load = (enqueued - received) * 1000.0 if enqueued is not None else None
    if done is None or enqueued is None:
        return [load, None, None, None, total]
    return [load, (done - enqueued) * 1000.0 - compute_ms, compute_ms, (replied - done) * 1000.0, total]
