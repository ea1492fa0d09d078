"""The engine loop: the one thread that owns the engine and the scheduler.

Messages come in through :meth:`EngineLoop.submit` (:class:`Admit`, :class:`Cancel`; a deque
and a condition variable). Results go out through :attr:`EngineLoop.outbox` (:class:`Finished`,
:class:`Failed`, :class:`CancelOutcome`), after which ``wake()`` tells the transport's I/O
thread to read it; the loop never touches a socket. It blocks on the condition when nothing is
due (timeout: the nearest max_delay or deadline), and never spins.

With a circuit breaker (edge/serving/breaker.py) every batch is routed: to the primary engine,
to the fallback while the breaker is open (the requests are marked ``degraded``), or failed at
once with BREAKER_OPEN when there is no fallback. With a fallback the primary runs on a worker
thread of its own (edge/serving/engine_worker.py), so a primary that hangs costs the batch its
deadline, not the loop: the fallback, owned by this thread, goes on serving.

After a fresh CPU boot the loop also runs the shapes boot left unwarmed (``edge serve --warm-up``),
one at a time, when no client has sent for a moment (:data:`WARM_QUIET_S`), or between batches
once it has served for :data:`WARM_FORCE_S`; each run's time joins the breaker's yardstick.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable

import numpy as np

from edge.errors import ErrorCode
from edge.system.log import log, log_exception
from edge.serving.breaker import PROBE_DEADLINE_S, CircuitBreaker, Fallback, PrimaryTimeout, Route
from edge.serving.call_cost import CallCost
from edge.serving.engine_cost import EngineCost
from edge.serving.engine_worker import EngineWorker
from edge.serving.metrics import Metrics
from edge.serving.request import Admit, Cancel, CancelOutcome, Failed, Finished, Part, Request
from edge.serving.scheduler import BucketScheduler

__all__ = ["EngineLoop", "WARM_QUIET_S", "WARM_FORCE_S"]

# The deferred warm-up (edge.runtime.engine_chain.warm_plan) runs a shape once no request has come
# for WARM_QUIET_S: a client that sends at READY is served first, not after a warm-up run. Once the
# loop has served for WARM_FORCE_S, the rest run between batches even while requests queue (each
# waits one run at most): no traffic, honest or hostile, keeps the breaker's yardstick unmeasured.
WARM_QUIET_S = 0.025
WARM_FORCE_S = 1.0


class EngineLoop:
    def __init__(self, engine: Any, scheduler: BucketScheduler, *, pad_id: int,
                 buffers: dict[int, tuple[np.ndarray, np.ndarray]], metrics: Metrics,
                 wake: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.monotonic,
                 breaker: CircuitBreaker | None = None, fallback: Fallback | None = None,
                 cost: EngineCost | None = None, probe_ids: list[int] | None = None,
                 warm_later: list[tuple[int, int]] | None = None) -> None:
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
        self.breaker = breaker
        self.fallback = fallback
        self.worker = EngineWorker(engine) if fallback is not None else None  # the primary's own thread
        self.cost = cost  # the primary's warm-up time per shape: whose fault a late request is
        self.call_cost = CallCost()  # what one more call costs the primary, learned from its calls: where to cut a batch
        # The half-open probe's own input: (1, smallest bucket), the warm-up sample, never a client's.
        bucket = self.shapes.buckets[0]
        row = list(probe_ids or [self.pad_id])[:bucket]
        self._probe_ids = np.full((1, bucket), self.pad_id, dtype=np.int64)
        self._probe_mask = np.zeros((1, bucket), dtype=np.int64)
        self._probe_ids[0, :len(row)] = row
        self._probe_mask[0, :len(row)] = 1
        self._sample = list(probe_ids or [self.pad_id])  # the deferred warm-up's rows: the same sample
        # Shapes boot left to warm once READY (edge.runtime.engine_chain.warm_plan), run one at a
        # time while nothing is queued; their fastest runs join the breaker's yardstick.
        self.warm_later: list[tuple[int, int]] = list(warm_later or [])
        self.warmed_later: dict[str, float] = {}  # "RxT": ms, as stats reports it
        self.fallback_warmed_later: dict[str, float] = {}  # the fallback's, after the primary's
        self._started = self._last_arrival = 0.0  # monotonic s: the loop's start, the last request's arrival here

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
        if self.worker is not None:
            self.worker.stop()

    # ------------------------------------------------------------ the loop

    def run(self) -> None:
        self._started = self._last_arrival = self._clock()
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
                if self.breaker is not None and self.breaker.probe_due():
                    self._probe()
                    now = self._clock()
                batch = self.sched.next_batch(now)
                if batch is not None:
                    self._run_batch(*batch)
                    if self._warm_due_in(self._clock()) == 0.0:  # forced: one run between two batches
                        self._warm_next()
                    continue
                if self._warm_due_in(now) == 0.0:
                    self._warm_next()
                    continue
            except Exception:  # a bug here must not hang every queued request
                log_exception("engine.loop_failed", trace_ids=[p.request.trace_id for p in self._current])
                self._fail_all("engine loop failure")
            with self._cond:
                if self._intake or self._stop:
                    continue
                timeout = self.sched.next_wakeup(self._clock())
                probe_in = self.breaker.seconds_to_probe() if self.breaker is not None else None
                if probe_in is not None:  # open: wake for the probe even when no client is waiting
                    timeout = probe_in if timeout is None else min(timeout, probe_in)
                warm_in = self._warm_due_in(self._clock())
                if warm_in is not None:  # wake when the engine has been quiet long enough to warm
                    timeout = warm_in if timeout is None else min(timeout, warm_in)
                if timeout is None or timeout > 0:
                    self._cond.wait(timeout)  # None: block until submit() or stop()

    def _emit(self, message: Finished | Failed | CancelOutcome) -> None:
        self.outbox.append(message)
        self.wake()

    def _ingest(self, message: Admit | Cancel) -> None:
        if isinstance(message, Admit):
            message.request.enqueued = self._last_arrival = self._clock()  # the end of its load phase (docs/trace.md)
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

    def _compute(self, bucket: int, parts: list[Part], route: Route = Route.PRIMARY,
                 until: float = 0.0) -> tuple[np.ndarray, int, int, int, int, float]:
        """Run the parts on the engine ``route`` names, in the calls :meth:`BatchShapes.groups`
        cuts them into: (out (len(parts), D) in the parts' order, rows and width of the batch's
        envelope (what the breaker judges), real tokens, padded tokens run, start). ``until``:
        when to stop waiting for a primary on its worker."""
        lengths = [len(p.ids) for p in parts]
        calls = self.shapes.groups(lengths, self.call_cost.tokens())
        start = self._clock()
        out: np.ndarray | None = None
        padded = 0
        for call in calls:
            t0 = self._clock()
            rows, width, got = self._call(bucket, [parts[i] for i in call], route, until)
            if route is Route.PRIMARY:  # the fallback's calls cost what another engine does
                self.call_cost.observe(rows * width, (self._clock() - t0) * 1000.0)
            if out is None:
                out = np.empty((len(parts), got.shape[1]), dtype=np.float32)
            out[call] = got[:len(call)]
            padded += rows * width
        assert out is not None  # a batch has a part
        rows = self.shapes.padded_rows(len(parts), bucket)
        width = self.shapes.width(bucket, max(lengths))
        return out, rows, width, sum(lengths), padded, start

    def _call(self, bucket: int, parts: list[Part], route: Route, until: float) -> tuple[int, int, np.ndarray]:
        """One engine call: the parts padded into the bucket's buffers; (rows, width, out (rows, D))."""
        n = len(parts)
        ids_buf, mask_buf = (self._fallback().buffers if route is Route.FALLBACK else self.buffers)[bucket]
        rows = self.shapes.padded_rows(n, bucket)
        width = self.shapes.width(bucket, max(len(p.ids) for p in parts))
        # (rows, width) int64 views of the bucket's buffers, C-contiguous: their first rows x width
        # elements reshaped, not a column slice (an engine takes the array's memory as it lies).
        ids = ids_buf.reshape(-1)[: rows * width].reshape(rows, width)
        mask = mask_buf.reshape(-1)[: rows * width].reshape(rows, width)
        ids.fill(self.pad_id)
        mask.fill(0)
        for i, p in enumerate(parts):
            k = len(p.ids)
            ids[i, :k] = p.ids
            mask[i, :k] = 1
        if rows > n:  # rows added to reach a warmed shape repeat the first one; their outputs are dropped
            ids[n:] = ids[0]
            mask[n:] = mask[0]
        if route is Route.FALLBACK:
            out = np.asarray(self._fallback().engine.run(ids, mask))  # (rows, D) float32
        else:
            out = np.asarray(self._on_primary(ids, mask, until))
        if out.ndim != 2 or out.shape[0] != rows or (self._dim is not None and out.shape[1] != self._dim):
            raise ValueError(f"engine returned shape {out.shape}, expected ({rows}, {self._dim or 'D'})")
        self._dim = out.shape[1]
        return rows, width, out

    def _fallback(self) -> Fallback:
        """The fallback, on Route.FALLBACK: the breaker routes there only when one is configured."""
        assert self.fallback is not None
        return self.fallback

    def _breaker(self) -> CircuitBreaker:
        """The breaker, where the loop already knows it has one (a probe, a route other than
        PRIMARY, a judgement: each happens only with a breaker)."""
        assert self.breaker is not None
        return self.breaker

    def _on_primary(self, ids, mask, until: float, unfaulted: bool = False):
        """The primary's run: here, or on its worker when a fallback exists, given up on at ``until``.
        ``unfaulted``: without the faults ``--fault-engine-*`` inject (a yardstick is measured so)."""
        run = getattr(self.engine, "unfaulted", self.engine).run if unfaulted else self.engine.run
        if self.worker is None:
            return run(ids, mask)
        t0 = self._clock()
        if not self.worker.wait_idle(until - t0):
            raise PrimaryTimeout("the primary engine is still running an earlier batch it was given up on",
                                 (self._clock() - t0) * 1000.0)
        self.worker.start(ids, mask, run)
        done, out = self.worker.wait(max(0.0, until - self._clock()))
        if not done:
            raise PrimaryTimeout("the primary engine did not return before the batch's last deadline",
                                 (self._clock() - t0) * 1000.0)
        return out

    def _warm_due_in(self, now: float) -> float | None:
        """Seconds until the next deferred warm-up run may start (0: now), or None while it may not:
        nothing left, the breaker not closed (the probes judge the primary then), or requests
        queued or coming in before :data:`WARM_FORCE_S` (see there)."""
        if not (self.warm_later or self._fallback_warm_left()) or (
                self.breaker is not None and self.breaker.route() is not Route.PRIMARY):
            return None
        if now - self._started >= WARM_FORCE_S:
            return 0.0
        with self._cond:
            if self._intake or self._stop:
                return None
        if self.sched.queued_requests():
            return None
        return max(0.0, self._last_arrival + WARM_QUIET_S - now)

    def _fallback_warm_left(self) -> list:
        return self.fallback.warm_later if self.fallback is not None else []

    def _warm_next(self) -> None:
        """One shape of the deferred warm-up: the primary's (without injected faults, as boot's
        warm-up ran, with the probe's deadline), then the fallback's. A request that comes
        meanwhile waits for this one run at most (the smallest shapes come first). The primary's
        runs join the breaker's yardstick."""
        if self.warm_later:
            warmed = self._warm_shape("primary", self.warm_later, self.buffers, self.warmed_later,
                                      lambda ids, mask, t0: self._on_primary(ids, mask, t0 + PROBE_DEADLINE_S,
                                                                             unfaulted=True))
            if warmed is not None:
                rows, tokens, ms = warmed
                self.call_cost.observe(rows * tokens, ms)
                if self.cost is not None:
                    self.cost.add(rows, tokens, ms)
            return
        fallback = self._fallback()  # on this thread, which owns the fallback
        self._warm_shape("fallback", fallback.warm_later, fallback.buffers, self.fallback_warmed_later,
                         lambda ids, mask, t0: fallback.engine.run(ids, mask))

    def _warm_shape(self, engine: str, queue: list, buffers: dict, warmed: dict, run) -> tuple[int, int, float] | None:
        """Run ``queue``'s first shape once, the warm-up's own sample in every row, in the bucket's
        ``buffers``; record its ms in ``warmed`` and return (rows, tokens, ms). A failure empties
        ``queue`` (that engine's deferred warm-up ends, logged; the breaker judges the engine on
        real batches) and returns None."""
        rows, tokens = queue.pop(0)
        ids_buf, mask_buf = buffers[tokens]
        ids, mask = ids_buf[:rows], mask_buf[:rows]
        row = self._sample[:tokens]
        ids.fill(self.pad_id)
        mask.fill(0)
        ids[:, :len(row)] = row
        mask[:, :len(row)] = 1
        t0 = self._clock()
        try:
            out = np.asarray(run(ids, mask, t0))
            ms = (self._clock() - t0) * 1000.0
            if out.ndim != 2 or out.shape[0] != rows or not np.isfinite(out).all():
                raise ValueError(f"output of shape {out.shape}, or not finite")
        except Exception as exc:
            log("warmup.deferred_failed", level="error", engine=engine, shape=f"{rows}x{tokens}",
                error=f"{type(exc).__name__}: {exc}"[:300], left=[f"{r}x{t}" for r, t in queue])
            queue.clear()
            return None
        finally:
            ids.fill(self.pad_id)  # stale rows must never look like real tokens
            mask.fill(0)
        warmed[f"{rows}x{tokens}"] = round(ms, 3)
        if not queue:
            log("warmup.deferred_done", engine=engine, shapes=warmed)
        return rows, tokens, ms

    def _probe(self) -> None:
        """One half-open probe of the breaker's: the server's own input on the primary, with the
        server's own deadline, so that no client's choice of deadline decides whether it closes."""
        t0 = self._clock()
        ok, why = False, ""
        try:
            out = np.asarray(self._on_primary(self._probe_ids, self._probe_mask, t0 + PROBE_DEADLINE_S))  # (1, D)
            took = self._clock() - t0
            if out.ndim != 2 or out.shape[0] != 1 or not np.isfinite(out).all():
                why = f"the probe's output has shape {out.shape} or is not finite"
            elif took > PROBE_DEADLINE_S:
                why = f"the probe took {took * 1000:.0f} ms, over its {PROBE_DEADLINE_S:g} s deadline"
            else:
                ok = True
        except Exception as exc:  # the engine failed or hung: the probe failed, the loop goes on
            why = f"{type(exc).__name__}: {exc}"[:200]
        breaker = self._breaker()
        breaker.probe_done(ok, why)
        log("breaker.probe", level="info" if ok else "warning", ok=ok, ms=round((self._clock() - t0) * 1000, 1),
            state=breaker.state.value, why=why or None)

    def _route(self) -> Route:
        return Route.PRIMARY if self.breaker is None else self.breaker.route()

    def _judge_late(self, requests: list[Request], end: float, rows: int, bucket: int, compute_ms: float) -> None:
        """Tell the breaker how the primary did: a late request counts against it only when its
        deadline was one the engine could meet and the engine was slow for the shape."""
        breaker = self._breaker()
        late = [(r, r.deadline) for r in requests if r.deadline is not None and end > r.deadline]  # (r, its deadline)
        impossible = not_slow = 0
        if self.cost is not None and late:
            impossible = sum(1 for r, deadline in late
                             if self.cost.impossible((deadline - r.arrival) * 1000.0, rows, bucket))
            if not self.cost.slow(compute_ms, rows, bucket):
                not_slow = len(late) - impossible
            breaker.not_the_engines_fault(impossible, not_slow)
        missed = len(late) - impossible - not_slow
        # In time, or late behind a queue while the engine ran at its speed: evidence it is well.
        # An impossible deadline is evidence of nothing.
        served = len(requests) - len(late) + not_slow
        breaker.primary_done(served, missed,
                             f"{missed} request(s) answered after their deadline; the {rows}x{bucket} batch "
                             f"took {compute_ms:.0f} ms (warm-up: {self._expected(rows, bucket)})")

    def _expected(self, rows: int, bucket: int) -> str:
        need = self.cost.expected_ms(rows, bucket) if self.cost is not None else None
        return "unknown" if need is None else f"{need:.1f} ms"

    def _run_batch(self, bucket: int, parts: list[Part]) -> None:
        self._current = parts
        self._batch_no += 1
        requests = list({id(p.request): p.request for p in parts}.values())
        route = self._route()
        if route is Route.FAIL_FAST:
            self._breaker().count(route, len(requests))
            self.sched.batch_done(self._clock())
            self._fail(requests, ErrorCode.BREAKER_OPEN, "the circuit breaker is open (the engine kept missing "
                       "deadlines or failing) and there is no fallback; retry after its cool-down")
            self._current = []
            return
        until = max(r.deadline if r.deadline is not None else r.eff_deadline for r in requests)
        try:
            out, rows, width, tokens, padded, start = self._compute(bucket, parts, route, until)
        except Exception as exc:
            self._batch_failed(bucket, parts, requests, route, exc)
            return
        end = self._clock()
        self.sched.batch_done(end)
        if route is Route.FALLBACK:
            newly = [r for r in requests if not r.degraded]  # a request's texts may span several batches
            self._breaker().count(route, len(newly))
            for request in newly:
                request.degraded = True
        compute_ms = (end - start) * 1000.0
        if route is Route.PRIMARY and self.breaker is not None:
            # Judged against the warm-up of the smallest bucket that holds the batch's width: the
            # shape the engine really ran is no longer than that one's.
            self._judge_late(requests, end, rows, self.shapes.bucket_for(width) or bucket, compute_ms)
        self.metrics.batch(bucket, len(parts), rows, width, tokens, compute_ms, padded_tokens=padded)
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

    def _batch_failed(self, bucket: int, parts: list[Part], requests: list[Request], route: Route,
                      exc: Exception) -> None:
        """The engine raised, or the primary timed out: every request of the batch fails (and, on the
        primary, counts against it)."""
        self.sched.batch_done(self._clock())
        timed_out = isinstance(exc, PrimaryTimeout)
        if route is Route.PRIMARY and self.breaker is not None:
            self._judge_failure(bucket, len(parts), requests, exc, timed_out)
        if not timed_out:
            self.metrics.engine_failed()
        log("engine.batch_failed", level="error", texts=len(parts), bucket=bucket, error=repr(exc), route=route.value,
            trace_ids=sorted({r.trace_id for r in requests}))
        if timed_out:
            self._fail(requests, ErrorCode.DEADLINE_EXCEEDED, f"{exc}"[:300])
        else:
            self._fail(requests, ErrorCode.ENGINE_FAILED, f"engine failed: {type(exc).__name__}: {exc}"[:300])
        self._current = []

    def _judge_failure(self, bucket: int, n: int, requests: list[Request], exc: Exception, timed_out: bool) -> None:
        """A failure counts against the primary; a wait given up on counts only when the engine had
        more time than a slow run of the shape needs (a 5 ms deadline is the client's choice)."""
        breaker = self._breaker()
        rows = self.shapes.padded_rows(n, bucket)
        if timed_out and self.cost is not None and not self.cost.slow(getattr(exc, "waited_ms", 0.0), rows, bucket):
            breaker.not_the_engines_fault(len(requests), 0)  # neither a miss nor a success
            return
        breaker.primary_done(0, len(requests), f"{type(exc).__name__}: {exc}"[:200],
                             cause="hung" if timed_out else "failed")
