"""The engine loop: the one thread that owns the engine and the scheduler.

Messages come in through :meth:`EngineLoop.submit` (:class:`Admit`, :class:`Cancel`; a deque
and a condition variable). Results go out through :attr:`EngineLoop.outbox` (:class:`Finished`,
:class:`Failed`, :class:`CancelOutcome`), after which ``wake()`` tells the transport's I/O
thread to read it; the loop never touches a socket. It blocks on the condition when nothing is
due (timeout: the nearest max_delay or deadline), and never spins.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable

import numpy as np

from edge.errors import ErrorCode
from edge.log import log, log_exception
from edge.serving.metrics import Metrics
from edge.serving.request import Admit, Cancel, CancelOutcome, Failed, Finished, Part, Request
from edge.serving.scheduler import BucketScheduler

__all__ = ["EngineLoop"]


class EngineLoop:
    def __init__(self, engine: Any, scheduler: BucketScheduler, *, pad_id: int,
                 buffers: dict[int, tuple[np.ndarray, np.ndarray]], metrics: Metrics,
                 wake: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.sched = scheduler
        self.shapes = scheduler.shapes
        self.pad_id = int(pad_id)
        self.buffers = buffers
        self.metrics = metrics
        self.outbox: deque = deque()  # read by the I/O thread after wake()
        self.wake = wake  # set by the transport: tells its I/O thread the outbox has news
        self._clock = clock
        self._intake: deque = deque()
        self._cond = threading.Condition()
        self._stop = False
        self._batch_no = 0
        self._dim: int | None = None  # embedding width, fixed by the first batch
        self._current: list[Part] = []  # the batch being run

    # ------------------------------------------------- called by other threads

    def submit(self, message: Admit | Cancel) -> None:
        """Thread-safe."""
        with self._cond:
            self._intake.append(message)
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()

    # ------------------------------------------------------------ the loop

    def run(self) -> None:
        while True:
            with self._cond:
                if self._stop:
                    return
                messages = list(self._intake)
                self._intake.clear()
            try:
                for message in messages:
                    self._ingest(message)
                now = self._clock()
                for request in self.sched.expire(now):
                    self._emit(Failed(request, ErrorCode.DEADLINE_EXCEEDED, "deadline passed before the request ran"))
                batch = self.sched.next_batch(now)
                if batch is not None:
                    self._run_batch(*batch)
                    continue
            except Exception:  # a bug here must not hang every queued request
                log_exception("engine.loop_failed", trace_ids=[p.request.trace_id for p in self._current])
                self._fail_all("engine loop failure")
            with self._cond:
                if self._intake or self._stop:
                    continue
                timeout = self.sched.next_wakeup(self._clock())
                if timeout is None or timeout > 0:
                    self._cond.wait(timeout)  # None: block until submit() or stop()

    def _emit(self, message: Finished | Failed | CancelOutcome) -> None:
        self.outbox.append(message)
        self.wake()

    def _ingest(self, message: Admit | Cancel) -> None:
        if isinstance(message, Admit):
            message.request.enqueued = self._clock()  # the end of its load phase (docs/trace.md)
            self.sched.add(message.request)
            return
        target = message.target
        if target.finished:
            self._emit(CancelOutcome(message.reply_to, target, False))
        else:
            self.sched.drop(target)
            self._emit(Failed(target, ErrorCode.CANCELLED, "cancelled by a cancel message"))
            self._emit(CancelOutcome(message.reply_to, target, True))

    def _fail(self, requests: list[Request], code: ErrorCode, message: str) -> None:
        for request in {id(r): r for r in requests}.values():
            if not request.finished:
                self.sched.drop(request)
                self._emit(Failed(request, code, message))

    def _fail_all(self, message: str) -> None:
        """After a bug in the loop: answer the batch being run and everything queued."""
        self._fail([p.request for p in self._current] + self.sched.queued_requests(), ErrorCode.INTERNAL, message)
        self._current = []

    def _compute(self, bucket: int, parts: list[Part]) -> tuple[np.ndarray, int, int, float]:
        """Pad the parts into the bucket's buffers and run the engine: (out (rows, D), rows, tokens, start)."""
        n = len(parts)
        ids_buf, mask_buf = self.buffers[bucket]
        rows = self.shapes.padded_rows(n, bucket)
        ids, mask = ids_buf[:rows], mask_buf[:rows]  # (rows, bucket) int64 views
        ids.fill(self.pad_id)
        mask.fill(0)
        tokens = 0
        for i, p in enumerate(parts):
            k = len(p.ids)
            ids[i, :k] = p.ids
            mask[i, :k] = 1
            tokens += k
        if rows > n:  # rows added to reach a warmed shape repeat the first one; their outputs are dropped
            ids[n:] = ids[0]
            mask[n:] = mask[0]
        start = self._clock()
        out = np.asarray(self.engine.run(ids, mask))  # (rows, D) float32
        if out.ndim != 2 or out.shape[0] != rows or (self._dim is not None and out.shape[1] != self._dim):
            raise ValueError(f"engine returned shape {out.shape}, expected ({rows}, {self._dim or 'D'})")
        self._dim = out.shape[1]
        return out, rows, tokens, start

    def _run_batch(self, bucket: int, parts: list[Part]) -> None:
        self._current = parts
        self._batch_no += 1
        try:
            out, rows, tokens, start = self._compute(bucket, parts)
        except Exception as exc:
            self.sched.batch_done(self._clock())
            self.metrics.engine_failed()
            log("engine.batch_failed", level="error", texts=len(parts), bucket=bucket, error=repr(exc),
                trace_ids=sorted({p.request.trace_id for p in parts}))
            self._fail([p.request for p in parts], ErrorCode.ENGINE_FAILED,
                       f"engine failed: {type(exc).__name__}: {exc}"[:300])
            self._current = []
            return
        end = self._clock()
        self.sched.batch_done(end)
        compute_ms = (end - start) * 1000.0
        self.metrics.batch(bucket, len(parts), rows, tokens, compute_ms)
        for i, p in enumerate(parts):
            request = p.request
            if request.finished:
                continue
            if request.out is None:
                request.out = np.empty((request.texts, out.shape[1]), dtype=np.float32)  # (N, D)
            request.out[p.index] = out[i]
            request.queue_ms = max(request.queue_ms, (start - request.arrival) * 1000.0)
            if request.last_batch != self._batch_no:
                request.last_batch = self._batch_no
                request.compute_ms += compute_ms
                request.batches.append([self._batch_no, len(parts)])
            request.remaining -= 1
            if request.remaining == 0:
                request.finished = True
                request.done = end
                self._emit(Finished(request))
        self._current = []
