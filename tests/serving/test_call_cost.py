"""CallCost (edge/serving/call_cost.py): a call's own cost in tokens of work, fitted from timed calls."""

from __future__ import annotations

import random

from edge.serving.call_cost import MAX_TOKENS, MIN_CALLS, PRIOR_TOKENS, CallCost


def _feed(cost: CallCost, fixed_ms: float, ms_per_token: float, calls: int, seed: int = 0, noise: float = 0.0) -> None:
    rng = random.Random(seed)
    for _ in range(calls):
        n = rng.choice([4, 16, 48, 128, 512, 2048])
        cost.observe(n, (fixed_ms + ms_per_token * n) * (1.0 + rng.uniform(-noise, noise)))


def test_the_prior_stands_until_enough_calls_were_seen():
    cost = CallCost()
    _feed(cost, 7.0, 0.2, MIN_CALLS - 1)
    assert cost.tokens() == PRIOR_TOKENS and not cost.as_dict()["learned"]
    _feed(cost, 7.0, 0.2, 1)
    assert abs(cost.tokens() - 35.0) < 0.01 and cost.as_dict()["learned"]


def test_a_busy_day_and_a_quiet_one_give_their_own_figures_despite_noise():
    busy, quiet = CallCost(), CallCost()
    _feed(busy, 6.7, 0.19, 400, noise=0.2)  # 1 x 16 in 10 ms: ~35 tokens
    _feed(quiet, 1.0, 0.125, 400, noise=0.2)  # 1 x 4 in 1.4 ms: ~8 tokens
    assert 25.0 < busy.tokens() < 45.0, busy.as_dict()
    assert 4.0 < quiet.tokens() < 12.0, quiet.as_dict()


def test_the_fit_follows_the_machine_as_it_changes():
    cost = CallCost()
    _feed(cost, 10.0, 0.1, 300)
    assert abs(cost.tokens() - 100.0) < 1.0
    _feed(cost, 0.5, 0.1, 3000, seed=1)  # the load went away: older calls are forgotten
    assert abs(cost.tokens() - 5.0) < 1.0, cost.as_dict()


def test_calls_of_one_size_teach_nothing_and_nonsense_is_not_learned():
    same = CallCost()
    for _ in range(100):
        same.observe(256, 12.0)
    assert same.tokens() == PRIOR_TOKENS and not same.as_dict()["learned"]
    falling = CallCost()  # bigger calls faster: noise, not a model
    for i in range(100):
        n = 16 * (1 + i % 8)
        falling.observe(n, 50.0 - 0.05 * n)
    assert falling.tokens() == PRIOR_TOKENS
    for bad in (0, -5):
        falling.observe(bad, 1.0)
    falling.observe(64, 0.0)  # a clock that did not move
    assert falling.calls == 100


def test_the_figure_is_clamped():
    huge = CallCost()
    _feed(huge, 1000.0, 0.01, 100)  # 100,000 tokens: never more than a long text's worth
    assert huge.tokens() == MAX_TOKENS
    tiny = CallCost()
    _feed(tiny, 0.0, 0.2, 100)
    assert tiny.tokens() == 1.0
