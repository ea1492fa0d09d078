"""The serving core, built in one place: shapes, admission, tokenizer stage, scheduler, engine
loop, metrics.

The transport (``edge/ipc/server.py``) owns sockets and replies; it hands admitted requests to
this core and reads results from its outbox. Nothing here knows about ZeroMQ, so the core runs
the same under the socket server, a benchmark or a test.

Owners: the shapes are read-only; admission's counters take a lock of their own (the I/O thread
reserves and releases, the tokenizer stage admits); the tokenizer belongs to the tokenizer
stage's thread; the scheduler's queue, the engine and the buffers belong to the engine loop's
thread; the metrics take a lock of their own.
"""

from __future__ import annotations

import threading
from typing import Any

from edge.engines.device import device_kind
from edge.serving.admission import Admission
from edge.serving.breaker import CircuitBreaker, Fallback
from edge.serving.engine_cost import EngineCost
from edge.serving.engine_loop import EngineLoop
from edge.serving.metrics import Metrics
from edge.serving.request import Cancel, Request
from edge.serving.scheduler import BucketScheduler
from edge.serving.shapes import BatchShapes
from edge.serving.tokenize_stage import TokenizeStage
from edge.preload.serving_settings import ServingSettings
from edge.warmup import preallocate

__all__ = ["ServingCore"]


class ServingCore:
    def __init__(self, engine: Any, tokenizer: Any, settings: ServingSettings | dict | None = None, *,
                 max_seq_length: int | None = None, buffers: dict | None = None,
                 shapes: BatchShapes | None = None, breaker: CircuitBreaker | None = None,
                 fallback: Fallback | None = None, cost: EngineCost | None = None,
                 probe_ids: list[int] | None = None, warm_later: list[tuple[int, int]] | None = None) -> None:
        """``settings``: the package's record (a dict is validated into one, as a manifest's is).
        ``buffers``: input buffers from ``edge.warmup.preallocate`` (pinned on CUDA); made here
        when not given. ``shapes``: the ones boot warmed with; derived here when not given.
        ``breaker``: the circuit breaker (its defaults when not given); ``fallback``: what serves
        while it is open (none: requests then fail fast with BREAKER_OPEN). ``cost``: the primary's
        time per shape from its warm-up, which tells the breaker an engine's miss from a client's
        impossible deadline (without it every late request counts). ``probe_ids``: the server's own
        input for the breaker's half-open probes (the package's warm-up sample). ``warm_later``: the
        shapes boot left for the engine loop to warm once READY, when idle (``edge serve --warm-up``)."""
        if shapes is None:
            if not isinstance(settings, ServingSettings):
                settings = ServingSettings.model_validate(settings or {})
            shapes = BatchShapes(settings, max_seq_length=max_seq_length, kind=device_kind(engine.device))
        self.shapes = shapes
        self.engine = engine
        self.fallback = fallback
        self.breaker = breaker or CircuitBreaker(has_fallback=fallback is not None)
        self.metrics = Metrics(shapes.buckets)
        self.admission = Admission(tokenizer, shapes)
        self.scheduler = BucketScheduler(shapes)
        self.loop = EngineLoop(engine, self.scheduler, pad_id=getattr(tokenizer, "pad_id", 0),
                               buffers=buffers if buffers is not None else preallocate(shapes, engine),
                               metrics=self.metrics, breaker=self.breaker, fallback=fallback, cost=cost,
                               probe_ids=probe_ids or _probe_ids(tokenizer, shapes), warm_later=warm_later)
        self.outbox = self.loop.outbox
        self.tokenize = TokenizeStage(self.admission, self.loop.submit, self.outbox, self.metrics)
        self._thread: threading.Thread | None = None

    def start(self, wake) -> None:
        """Start the engine loop's and the tokenizer stage's threads; ``wake()`` is called after
        each message put in the outbox."""
        self.loop.wake = wake
        self._thread = threading.Thread(target=self.loop.run, name="edge-engine-loop", daemon=True)
        self._thread.start()
        self.tokenize.start(wake)

    def stop(self, timeout_s: float = 2.0) -> bool:
        """Stop both threads; True once the loop's has ended (an engine stuck in run() keeps it)."""
        self.tokenize.stop(timeout_s)
        self.loop.stop()
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    # ---------------------------------------------------------------- I/O thread

    def admit(self, texts: list[str], truncate: bool, arrival: float, *, text_bytes: int | None = None,
              **fields) -> Request:
        """Count ``texts`` against the tokenizer's backlog and hand them to the tokenizer stage.
        Raises OVERLOADED before anything is queued; later refusals (EMPTY_TEXT, TOO_MANY_TOKENS,
        a full queue) come back through the outbox as :class:`Failed`."""
        if text_bytes is None:
            text_bytes = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
        self.admission.reserve(text_bytes)  # raises OVERLOADED; nothing after it can fail
        request = Request([], [], arrival, texts_in=texts, text_bytes=text_bytes, truncate=truncate, **fields)
        self.tokenize.submit(request)
        return request

    def cancel(self, target: Request, reply_to: Any) -> None:
        self.tokenize.submit(Cancel(target, reply_to))

    def release(self, request: Request) -> None:
        """``request`` was answered: it leaves the queue bound."""
        self.admission.release(request)


def _probe_ids(tokenizer: Any, shapes: BatchShapes) -> list[int]:
    """The probe's ids when the package stores no warm-up sample: the warm-up text, tokenized."""
    from edge.warmup import WARM_TEXT

    return list(tokenizer.encode(WARM_TEXT, max_length=shapes.buckets[0]).ids)
