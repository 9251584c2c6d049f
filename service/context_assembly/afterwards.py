"""Bookkeeping that no caller waits for, run a moment after the answer.

The metric observations of a preparation and the access log line of every request are recorded
after the request is answered (when exactly: below), not on the way out of it. Why: a caller that sends
its next request as soon as it has read an answer (an agent runtime preparing calls in a row, a
load generator) found the service still busy with the previous request's bookkeeping. At
concurrency 1 on the project machine that bookkeeping took ~0.2 ms after the body was sent (cold
caches: ~0.1 ms the observation, ~0.1 ms the access line and request counter), and the next request
was read only after it (docs/performance.md). Deferred, it runs while that next request awaits its
contributors, or with the requests' other work when the loop is busy; the CPU is the same.

When: a request that waited on other services (its contributors: ``note_wait``) leaves its
bookkeeping to the timer, ``AFTER_SECONDS`` later; a request that waited on nothing has it run at
the loop's next turn after its answer is written. The request's end chooses (``settle``); until
then, work deferred inside a request that has not waited sets no timer. Why the two: the next request of a
caller that waits on contributors will itself wait, and the timer falls in that wait; a request
answered from CPU work alone offers no such wait, and there the timer fell inside a later request,
on cold caches. Measured on the project machine (interleaved A/Bs of 12 rounds at c=1, each with
a second copy of the old code as the control): with this rule the inline 128-block prepare's p50
was 0.947x and 0.984x the timer-only code's (controls 1.012x and 0.994x); run soon for every
request, the fan-out prepare's p50 was 1.009x (control 1.000x), which is why a request that
waited keeps the timer.

Pending work runs in the order it was deferred, and ``run_pending`` runs it at once: ``/metrics``
calls it before rendering, so a scrape counts every request answered before it, and the lifespan at
shutdown, so a clean stop loses nothing (a killed process loses at most the last 2 ms of lines and
observations). An access line's timestamp is when it was written, up to ~2 ms after the answer;
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

# Later than a prepare's own work before its first contributor call (~0.6–1.3 ms at c=1 on the
# project machine), much sooner than a scrape interval.
AFTER_SECONDS: Final = 0.002

# Whether the request of the current context waited on another service (``note_wait``);
# ``None`` outside a request.
_WAITED: Final[contextvars.ContextVar[bool | None]] = contextvars.ContextVar(
    "context_assembly_request_waited", default=None
)


def begin_request() -> contextvars.Token[bool | None]:
    """Start a request that has waited on nothing yet; ``end_request`` with the token after it."""
    return _WAITED.set(False)


def note_wait() -> None:
    """Mark the current request as one that waits on another service (a contributor call)."""
    _WAITED.set(True)


def end_request(token: contextvars.Token[bool | None]) -> bool:
    """Whether the request begun with ``token`` waited on another service; forgets the mark."""
    waited = _WAITED.get() is True
    _WAITED.reset(token)
    return waited


class Afterwards:
    """A queue of bookkeeping calls, run ``delay`` seconds after the first of them is deferred, or
    at the loop's next turn when a request that waited on nothing ends (``settle``)."""

    __slots__ = ("_delay", "_handle", "_loop", "_pending", "_soon")

    def __init__(self, delay: float = AFTER_SECONDS) -> None:
        self._delay = delay
        self._pending: deque[tuple[Callable[..., object], tuple[Any, ...]]] = deque()
        self._handle: asyncio.Handle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop ``_handle`` is on
        self._soon = False  # ``_handle`` runs at the loop's next turn, not at the timer

    def defer(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` a moment from now on the running loop (at once without one).

        Inside a request that has waited on nothing yet, the run is left to the request's end
        (``settle``), which knows whether it is the timer or the next turn: no timer is set only
        to be replaced. (Work deferred so by a task the request started, after the request has
        ended, waits for the next run: no task does that today.)
        """
        self._pending.append((fn, args))
        if _WAITED.get() is not False:
            self._schedule(soon=False)

    def settle(self, waited: bool) -> None:
        """A request has ended: run what is pending at the timer if it ``waited`` on another
        service (``end_request``), else at the loop's next turn."""
        if self._pending:
            self._schedule(soon=not waited)

    def _schedule(self, *, soon: bool) -> None:
        """Make sure a run is set on the running loop: at the timer, or at its next turn."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.run_pending()
            return
        if self._handle is not None and self._loop is loop and (self._soon or not soon):
            return  # the run already set covers this (a next-turn run covers a timer's work)
        # None yet, a timer where the next turn is asked for, or a run left on a loop that has
        # gone (an app served again on a new loop, as tests do, without a shutdown in between).
        if self._handle is not None and self._loop is loop:
            self._handle.cancel()  # (one on a gone loop never runs: left alone)
        self._loop = loop
        self._soon = soon
        self._handle = (
            loop.call_soon(self.run_pending)
            if soon
            else loop.call_later(self._delay, self.run_pending)
        )

    def run_pending(self) -> None:
        """Run everything deferred so far, in order, in an empty ``contextvars`` context (also
        when a request runs it: ``/metrics`` does)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._soon = False
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
