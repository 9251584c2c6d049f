"""How many examples the property, fuzz and state-machine tests draw.

CI draws a bounded number of each (and the fuzz tests a fixed, derandomized set), so that it stays
within its time. ``CA_EXAMPLES_SCALE=<n>`` multiplies every count by ``n`` and draws at random:
``make test-deep`` runs the suite so (scale 10 by default). Every ``@given`` test names its count
through ``examples``, so that none is left at Hypothesis's default. Longer runs find
what CI's counts do not draw; a failure a deep run finds should be pinned the same way.
"""

from __future__ import annotations

import os

SCALE = max(1, int(os.environ.get("CA_EXAMPLES_SCALE", "1")))
DEEP = SCALE > 1


def examples(count: int) -> int:
    """``count`` examples in CI, ``count * SCALE`` in a deep run."""
    return count * SCALE
