"""The engine loop: the one thread that owns the engine and the scheduler.

Requests come in through :meth:`EngineLoop.submit` (called by the I/O thread:
a deque and a condition variable). Results go out through an outbox deque; a
zero-length frame on an inproc PAIR socket wakes the I/O thread, which encodes
and sends them. The loop never touches the client socket and blocks on the
condition when there is nothing due (timeout = nearest max_delay or deadline).

Outbox items (tuples, first element is the kind):
    ("done", job)                          every part of the job ran
    ("error", job, code, message)          the job ends with an error (expired, cancelled, engine failed)
    ("cancel", cancel_ctx, target, bool)   answer to a cancel message: was the target still queued
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable

import numpy as np
import zmq

from edge.errors import ErrorCode
from edge.log import log, log_exception
from edge.ipc.stats import Metrics
from edge.scheduler import BucketScheduler, Part

__all__ = ["EngineLoop", "allocate_buffers"]



def allocate_buffers(caps: dict[int, int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Input buffers per bucket: (ids, mask), each (rows, bucket) int64."""
    return {b: (np.zeros((r, b), dtype=np.int64), np.zeros((r, b), dtype=np.int64)) for b, r in caps.items()}


class EngineLoop:
    def __init__(
        self,
        engine: Any,
        scheduler: BucketScheduler,
        *,
        pad_id: int,
        buffers: dict[int, tuple[np.ndarray, np.ndarray]],
        metrics: Metrics,
        wake_endpoint: str,
        context: zmq.Context,
        warmed_batch_sizes: list[int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.sched = scheduler
        self.pad_id = int(pad_id)
        self.buffers = buffers
        self.metrics = metrics
        self.outbox: deque = deque()  # read by the I/O thread
        self._wake_endpoint = wake_endpoint
        self._ctx = context
        self._wake: zmq.Socket | None = None
        self._warmed = sorted(set(warmed_batch_sizes or []))
        self._clock = clock
        self._intake: deque = deque()
        self._cond = threading.Condition()
        self._stop = False
        self._batch_no = 0
        self._dim: int | None = None  # embedding width, fixed by the first batch
        self._current: list[Part] = []  # the batch being run

    # ------------------------------------------------- called by other threads

    def submit(self, item: tuple) -> None:
        """("add", job) or ("cancel", job, cancel_ctx); thread-safe."""
        with self._cond:
            self._intake.append(item)
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()

    # ------------------------------------------------------------ the loop

    def run(self) -> None:
        self._wake = self._ctx.socket(zmq.PAIR)
        self._wake.setsockopt(zmq.LINGER, 0)
        self._wake.connect(self._wake_endpoint)
        try:
            while True:
                with self._cond:
                    if self._stop:
                        return
                    items = list(self._intake)
                    self._intake.clear()
                try:
                    for item in items:
                        self._ingest(item)
                    now = self._clock()
                    for job in self.sched.expire(now):
                        self._emit(("error", job, ErrorCode.DEADLINE_EXCEEDED, "deadline passed before the request ran"))
                    batch = self.sched.next_batch(now)
                    if batch is not None:
                        self._run_batch(*batch)
                        continue
                except Exception:  # a bug here must not hang every queued request
                    log_exception("engine.loop_failed")
                    self._fail_all("engine loop failure")
                with self._cond:
                    if self._intake or self._stop:
                        continue
                    timeout = self.sched.next_wakeup(self._clock())
                    if timeout is None or timeout > 0:
                        self._cond.wait(timeout)  # None: block until submit() or stop()
        finally:
            self._wake.close(0)

    def _emit(self, item: tuple) -> None:
        self.outbox.append(item)
        try:
            self._wake.send(b"", zmq.NOBLOCK)
        except zmq.Again:  # a thousand wake-ups are already pending; the I/O thread will drain the outbox
            pass

    def _ingest(self, item: tuple) -> None:
        kind, job = item[0], item[1]
        if kind == "add":
            self.sched.add(job)
        elif kind == "cancel":
            if job.done:
                self._emit(("cancel", item[2], job, False))
            else:
                self.sched.drop(job)
                self._emit(("error", job, ErrorCode.CANCELLED, "cancelled by a cancel message"))
                self._emit(("cancel", item[2], job, True))

    def _fail(self, jobs, code: ErrorCode, message: str) -> None:
        for job in {id(j): j for j in jobs}.values():
            if not job.done:
                self.sched.drop(job)
                self._emit(("error", job, code, message))

    def _fail_all(self, message: str) -> None:
        """After a bug in the loop: answer the batch being run and everything queued."""
        self._fail([p.job for p in self._current] + self.sched.queued_jobs(), ErrorCode.INTERNAL, message)
        self._current = []

    def _rows_for(self, n: int, rows: int) -> int:
        """Rows to run: the smallest warmed batch size >= n that fits the buffer (else n)."""
        for s in self._warmed:
            if n <= s <= rows:
                return s
        return n

    def _compute(self, bucket: int, parts: list[Part]) -> tuple[np.ndarray, int, int, float]:
        """Pad the parts into the bucket's buffers and run the engine: (out (rows, D), rows, tokens, start)."""
        n = len(parts)
        ids_buf, mask_buf = self.buffers[bucket]
        rows = self._rows_for(n, ids_buf.shape[0])
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
            log("engine.batch_failed", texts=len(parts), bucket=bucket, error=repr(exc))
            self._fail([p.job for p in parts], ErrorCode.ENGINE_FAILED, f"engine failed: {type(exc).__name__}: {exc}"[:300])
            self._current = []
            return
        end = self._clock()
        self.sched.batch_done(end)
        compute_ms = (end - start) * 1000.0
        self.metrics.batch(bucket, len(parts), rows, tokens, compute_ms)
        for i, p in enumerate(parts):
            job = p.job
            if job.done:
                continue
            if job.out is None:
                job.out = np.empty((len(job.parts), out.shape[1]), dtype=np.float32)  # (N, D)
            job.out[p.index] = out[i]
            job.queue_ms = max(job.queue_ms, (start - job.arrival) * 1000.0)
            if job.last_batch != self._batch_no:
                job.last_batch = self._batch_no
                job.compute_ms += compute_ms
            job.remaining -= 1
            if job.remaining == 0:
                job.done = True
                self._emit(("done", job))
        self._current = []
