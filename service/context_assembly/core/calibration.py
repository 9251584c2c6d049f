"""Calibration of the conservative estimate by the provider's own counts (docs/api.md, "Counts").

The estimate (``tokens/estimate.py``) is meant to be over the real count of a model without a
public tokenizer, and on real text it is well over it (1.6–1.9 times an o200k count). Each usage
report of a ``main`` call says how many tokens the provider counted for a frame whose estimated
part the service knows, so the ratio of the two is an observation of how far over the estimate
is for this tenant's text on this model:

    ratio = provider input ÷ the estimate, unscaled

Only a wholly estimated frame is observed: an anchored one's estimated rest cannot be told apart
exactly (the provider's figure it anchored on also holds the previous turn's own messages).

The last ``WINDOW`` ratios are kept per tenant and model. Once there are ``MIN_REPORTS`` of
them, estimated counts are multiplied by the calibration factor

    factor = min(1, max(FLOOR, MARGIN × the largest kept ratio)), to two decimals

The correction is bounded both ways: it never raises a count (at most 1), never takes off more
than half (``FLOOR``), and follows the largest recent ratio with a margin, so one frame of text
the estimate fits worse than usual (code, another script) pulls it back at once. A frame whose
estimated part is small (under ``MIN_ESTIMATED``) says little and is not observed.

Pure: figures in, figures out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

WINDOW: Final = 50
MIN_REPORTS: Final = 5
MARGIN: Final = 1.1
FLOOR: Final = 0.5
MIN_ESTIMATED: Final = 1000


def factor(ratios: Sequence[float]) -> float | None:
    """The calibration factor of the kept ratios; ``None`` while there are too few."""
    if len(ratios) < MIN_REPORTS:
        return None
    return round(min(1.0, max(FLOOR, MARGIN * max(ratios))), 2)


def observed_ratio(
    provider_input: int | None, estimated_tokens: int | None, applied_factor: float | None
) -> float | None:
    """The ratio a usage report of a wholly estimated frame observes (module doc), or ``None``
    when it says nothing: no provider count, or too small an estimate."""
    if provider_input is None or estimated_tokens is None or estimated_tokens < MIN_ESTIMATED:
        return None
    if provider_input <= 0:
        return None
    return round(provider_input / (estimated_tokens / (applied_factor or 1.0)), 4)
