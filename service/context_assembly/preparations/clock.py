"""The wall and monotonic clocks the lifecycle reads, injectable for tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime


@dataclass(frozen=True, slots=True)
class Clock:
    """Wall and monotonic clocks, injectable for tests."""

    wall: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.wall(), UTC)
