"""image/fresh_boot.py's arithmetic: the ladder a measured fresh boot is rounded up to, the margin,
the floor, and what a pin does (the boots themselves: tests/image/test_package.py)."""

from __future__ import annotations

import pytest

from image.fresh_boot import MARGIN, budget_ms, fresh_boot_budgets, ladder_ms


@pytest.mark.parametrize("ms,step", [(0.0, 1000.0), (999.0, 1000.0), (1000.0, 1000.0), (1001.0, 1500.0),
                                     (1500.0, 1500.0), (1600.0, 2000.0), (2500.0, 3000.0), (3900.0, 4000.0),
                                     (4100.0, 6000.0), (8700.0, 12000.0), (12001.0, 16000.0),
                                     (100_000.0, 128_000.0)])
def test_ladder(ms, step):
    assert ladder_ms(ms) == step


def test_budget_is_the_margin_over_the_slowest_run_on_the_ladder_and_never_under_the_floor():
    assert MARGIN == 3.0
    assert budget_ms([900.0, 1300.0, 1100.0], 1500.0) == 4000.0  # 3 x 1300 = 3900 -> 4 s
    assert budget_ms([2900.0], 1500.0) == 12000.0  # 8.7 s -> 12 s
    assert budget_ms([300.0, 310.0], 1500.0) == 1500.0  # 0.93 s: the boot budget is the floor
    assert budget_ms([300.0], 2500.0) == 2500.0


def test_pinned_engines_are_not_measured_and_unknown_ones_refused(tmp_path):
    budgets, report = fresh_boot_budgets(tmp_path, ["onnxruntime"], 1500.0, pinned={"onnxruntime": 2222.0})
    assert budgets == {"onnxruntime": 2222.0} and report["runs"] == {} and report["pinned"] == ["onnxruntime"]
    with pytest.raises(ValueError, match="torchscript"):
        fresh_boot_budgets(tmp_path, ["onnxruntime"], 1500.0, pinned={"torchscript": 9000.0})
