"""Bookkeeping that no caller waits for, run a moment after the answer, in batches.

The metric observations of a preparation and the access log line of every request are recorded
after the request is answered, not on the way out of it: ``AFTER_SECONDS`` (10 ms) after the first
of them is deferred, together with everything deferred meanwhile. Why after: a caller that sends
its next request as soon as it has read an answer (an agent runtime preparing calls in a row, a
load generator) found the service still busy with the previous request's bookkeeping (~0.2 ms at
concurrency 1 on the project machine, on cold caches). Why in batches: at concurrency 1 an inline
prepare leaves the service no idle gap, so bookkeeping run after each answer still delayed the
next request by all of its cost; run for ten requests at once, on warm caches, it costs the
service less CPU and nine requests in ten none of it (docs/performance.md). Measured on the project
machine (interleaved A/Bs at c=1, each with a second copy of the old code as the control): the
inline 128-block prepare's p50 was 0.981x the code that ran it at the loop's next turn after each
answer (36 rounds; control 0.997x), its CPU 0.977x (1.005x); the fan-out prepare's p50 did not
move (c=1 1.004x, control 1.007x; c=16 0.987x, control 0.983x), its CPU at c=16 0.968x (0.996x).

Pending work runs in the order it was deferred, and ``run_pending`` runs it at once: ``/metrics``
calls it before rendering, so a scrape counts every request answered before it, and the lifespan at
shutdown, so a clean stop loses nothing (a killed process loses at most the last 10 ms of lines and
observations). An access line's timestamp is when it was written, up to ~10 ms after the answer;
its ``duration_ms`` is measured as before. A failure in one piece is logged by name and does not stop
the rest. Deferred work runs in an empty ``contextvars`` context: the request it belongs to passes
what it needs (its request id) itself.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import structlog

log = structlog.get_logger("context_assembly.afterwards")

# Long enough to gather the bookkeeping of ~10 inline prepares at c=1 (~0.9 ms each on the
# project machine), much sooner than a scrape interval.
AFTER_SECONDS: Final = 0.010


class Afterwards:
    """A queue of bookkeeping calls, run together ``delay`` seconds after the first of them is
    deferred."""

    __slots__ = ("_delay", "_handle", "_loop", "_pending")

    def __init__(self, delay: float = AFTER_SECONDS) -> None:
        self._delay = delay
        self._pending: deque[tuple[Callable[..., object], tuple[Any, ...]]] = deque()
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop ``_handle`` is on

    def defer(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` with the next batch, on the running loop (at once without one)."""
        self._pending.append((fn, args))
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.run_pending()
            return
        # A timer left on a loop that has gone (an app served again on a new loop, as tests do,
        # without a shutdown in between) never runs: a new one is set on this loop.
        if self._handle is None or self._loop is not loop:
            self._loop = loop
            self._handle = loop.call_later(self._delay, self.run_pending)

    def run_pending(self) -> None:
        """Run everything deferred so far, in order, in an empty ``contextvars`` context (also
        when a request runs it: ``/metrics`` does)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._pending:
            contextvars.Context().run(self._drain)

    def _drain(self) -> None:
        pending = self._pending
        while pending:
            fn, args = pending.popleft()
            try:
                fn(*args)
            except Exception:
                log.exception("bookkeeping_failed", call=getattr(fn, "__qualname__", repr(fn)))

    def __len__(self) -> int:
        return len(self._pending)
