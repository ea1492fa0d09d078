"""What the engine needs for a shape, from its own warm-up: the yardstick that tells a miss the
engine is to blame for from one the client chose (docs/breaker.md).

Warm-up runs every served shape ``warm_repeats`` times (edge/warmup.py) and keeps the fastest run
of each, in ms. A request that misses its deadline counts against the engine only when

* its budget (deadline - arrival) was at least what the engine needs for its batch's shape: a
  5 ms deadline on a shape that takes 10 ms is the client's impossible choice, and
* the batch's compute took more than ``SLOW_FACTOR`` times that, plus ``SLOW_SLACK_MS``: the
  engine itself was slow, not the queue in front of it (a flood of honest or hostile requests
  makes requests late without any fault of the engine's).

Without warm-up timings (a core built without them) every late request counts, as before. A
bucket whose deferred warm-up (``edge serve --warm-up``) has not run yet is estimated from a
warmed one (:meth:`EngineCost.expected_ms`).
"""

from __future__ import annotations

__all__ = ["EngineCost", "SLOW_FACTOR", "SLOW_SLACK_MS"]

# A healthy engine on a machine twice as busy as usual runs a shape in about 2x its warm time
# (measured here on busy days); 3x plus 10 ms leaves that noise out and still sees a fault that
# doubles the cost of every run.
SLOW_FACTOR = 3.0
SLOW_SLACK_MS = 10.0


class EngineCost:
    def __init__(self, warm_ms: dict[tuple[int, int], float]) -> None:
        """``warm_ms``: {(rows, tokens): fastest warm-up run in ms} of every warmed shape."""
        self.warm_ms = {(int(r), int(t)): float(ms) for (r, t), ms in warm_ms.items() if ms > 0}
        self._index()

    def _index(self) -> None:
        by_bucket: dict[int, list[tuple[int, float]]] = {}
        for (rows, tokens), ms in sorted(self.warm_ms.items()):
            by_bucket.setdefault(tokens, []).append((rows, ms))
        self._by_bucket = by_bucket  # one assignment: a reader on another thread sees the old or the new

    def add(self, rows: int, tokens: int, ms: float) -> None:
        """A warm-up run that came after READY (a deferred warm-up, edge/serving/engine_loop.py):
        the shape's yardstick from now on (the fastest, if it was warmed before)."""
        if ms > 0:
            key = (int(rows), int(tokens))
            self.warm_ms = {**self.warm_ms, key: min(float(ms), self.warm_ms.get(key, float(ms)))}
            self._index()

    def expected_ms(self, rows: int, bucket: int) -> float | None:
        """What the engine needs for ``rows`` x ``bucket`` (ms): the warm time of the largest warmed
        batch size <= rows, or of the smallest one scaled down by rows. A bucket not warmed (yet:
        a deferred warm-up) is estimated from its nearest warmed one, on the side that excuses
        more: a shorter bucket's time scaled up by length (a call's fixed cost makes that too much),
        else a longer bucket's time. Too much, not too little: until the bucket has run, a client's
        tight deadline is not blamed on the engine, so it cannot trip the breaker with one. None
        when nothing was warmed."""
        sizes = self._by_bucket.get(bucket)
        if not sizes:
            return self._estimated(rows, bucket)
        below = [ms for r, ms in sizes if r <= rows]
        if below:
            return below[-1]
        r0, ms0 = sizes[0]
        return ms0 * rows / r0

    def _estimated(self, rows: int, bucket: int) -> float | None:
        shorter = [b for b in self._by_bucket if b < bucket]
        if shorter:
            b = max(shorter)
            ms = self.expected_ms(rows, b)
            return None if ms is None else ms * bucket / b
        longer = [b for b in self._by_bucket if b > bucket]
        return self.expected_ms(rows, min(longer)) if longer else None

    def impossible(self, budget_ms: float, rows: int, bucket: int) -> bool:
        """The deadline gave less time than the engine needs for the shape at its best."""
        need = self.expected_ms(rows, bucket)
        return need is not None and budget_ms < need

    def slow(self, compute_ms: float, rows: int, bucket: int) -> bool:
        """The engine took clearly longer than its warm-up says the shape costs (True when unknown)."""
        need = self.expected_ms(rows, bucket)
        return need is None or compute_ms > SLOW_FACTOR * need + SLOW_SLACK_MS

    def as_dict(self) -> dict:
        return {f"{r}x{t}": round(ms, 3) for (r, t), ms in sorted(self.warm_ms.items())}
