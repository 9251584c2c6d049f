"""The estimate's calibration (core/calibration.py): bounded both ways, led by the largest
recent ratio, silent until enough reports."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from context_assembly.core import calibration
from hypothesis_budget import examples


@settings(max_examples=examples(200))
@given(st.lists(st.floats(0.01, 5.0), max_size=calibration.WINDOW))
def test_the_factor_is_bounded_and_covers_every_kept_ratio_with_a_margin(
    ratios: list[float],
) -> None:
    got = calibration.factor(ratios)
    if len(ratios) < calibration.MIN_REPORTS:
        assert got is None
        return
    assert got is not None
    assert calibration.FLOOR <= got <= 1.0
    # Never below any kept ratio (rounded to two decimals) unless held at the floor or the cap.
    assert got >= min(1.0, round(max(ratios) * calibration.MARGIN, 2)) or got == calibration.FLOOR


def test_one_frame_the_estimate_fits_worse_pulls_the_factor_back_at_once() -> None:
    steady = [0.52] * 10
    assert calibration.factor(steady) == 0.57
    assert calibration.factor([*steady, 0.9]) == 0.99


def test_small_or_missing_figures_observe_nothing() -> None:
    assert calibration.observed_ratio(None, 5000, None) is None
    assert calibration.observed_ratio(100, calibration.MIN_ESTIMATED - 1, None) is None
    assert calibration.observed_ratio(2600, 5000, None) == 0.52
    # A count made with a factor is unscaled before the ratio is taken.
    assert calibration.observed_ratio(2600, 2850, 0.57) == 0.52
