"""What one more engine call costs on this machine now, learned from the calls the engine runs.

A CPU batch runs as the calls :meth:`BatchShapes.groups` cuts it into, and a cut pays where the
padding it saves is worth more than a call's own cost (its fixed overhead: the thread pool's
hand-offs, the kernels' set-up), counted in tokens of work. That ratio is not a constant of the
model: on this 2-core host a call cost about 8 tokens on a quiet day (1 x 4 in 1.37 ms, 1 x 8 in
1.82 ms) and about 35 on a busy one (1 x 16 in 10 ms, 0.19 ms a token beyond it), and a Jetson's
cores give other figures again. So the engine loop times each call it runs and this fits

    ms = fixed + per_token x (rows x width)

over the recent calls (exponential forgetting, half-life :data:`HALF_LIFE_CALLS`), and the cut
uses ``fixed / per_token``. Until enough calls of different sizes were seen (or when the fit says
nothing sensible: bigger calls no dearer than small ones), the prior :data:`PRIOR_TOKENS`
stands. The result is clamped to [:data:`MIN_TOKENS`, :data:`MAX_TOKENS`].

Owned by the engine loop's thread (it observes and asks); ``as_dict`` is read by ``stats``
under the GIL.
"""

from __future__ import annotations

__all__ = ["CallCost", "PRIOR_TOKENS", "MIN_TOKENS", "MAX_TOKENS", "HALF_LIFE_CALLS", "MIN_CALLS"]

PRIOR_TOKENS = 8.0  # the quiet-day figure above, used until the fit has data
MIN_TOKENS, MAX_TOKENS = 1.0, 256.0  # a cut never costs less than a token, nor more than a long text
HALF_LIFE_CALLS = 256  # calls after which an observation weighs half: a busy minute is learned in seconds
MIN_CALLS = 16  # calls seen before the fit is used
# The sizes seen must spread: sd(rows x width) >= this share of their mean, or the intercept is noise.
MIN_SPREAD = 0.25


class CallCost:
    def __init__(self, prior_tokens: float = PRIOR_TOKENS, half_life_calls: int = HALF_LIFE_CALLS) -> None:
        self.prior = float(prior_tokens)
        self._decay = 0.5 ** (1.0 / half_life_calls)
        # weighted sums of 1, n, n^2, t, n*t (n: padded tokens of a call, t: its ms)
        self._w = self._n = self._nn = self._t = self._nt = 0.0
        self.calls = 0
        self._tokens = self.prior
        self._fit: tuple[float, float] | None = None  # (fixed ms, ms per token) once sensible

    def observe(self, tokens: int, ms: float) -> None:
        """One engine call of ``tokens`` padded tokens (rows x width) that took ``ms``."""
        if tokens <= 0 or not ms > 0.0:
            return
        d = self._decay
        n = float(tokens)
        self._w = self._w * d + 1.0
        self._n = self._n * d + n
        self._nn = self._nn * d + n * n
        self._t = self._t * d + ms
        self._nt = self._nt * d + n * ms
        self.calls += 1
        if self.calls >= MIN_CALLS:
            self._refit()

    def _refit(self) -> None:
        mean_n = self._n / self._w
        var_n = self._nn / self._w - mean_n * mean_n
        if var_n <= (MIN_SPREAD * mean_n) ** 2:
            return  # every call about the same size: the intercept cannot be told from the slope
        per_token = (self._nt / self._w - mean_n * self._t / self._w) / var_n
        fixed = self._t / self._w - per_token * mean_n
        if per_token <= 0.0:
            return  # bigger calls no dearer: noise, not a model; keep what was known
        fixed = max(fixed, 0.0)  # below zero: a call's own cost too small to see
        self._fit = (fixed, per_token)
        self._tokens = min(MAX_TOKENS, max(MIN_TOKENS, fixed / per_token))

    def tokens(self) -> float:
        """A call's own cost in tokens of work: the prior until the fit is sound."""
        return self._tokens

    def as_dict(self) -> dict:
        fixed, per_token = self._fit if self._fit is not None else (None, None)
        return {"tokens": round(self._tokens, 2), "learned": self._fit is not None, "calls": self.calls,
                "fixed_ms": None if fixed is None else round(fixed, 3),
                "ms_per_token": None if per_token is None else round(per_token, 5)}
