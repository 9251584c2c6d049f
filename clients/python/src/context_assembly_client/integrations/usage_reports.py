"""The adapters' usage reports: the ``normalized`` usage object (:func:`normalized_usage`), the
bounded queue that sends the reports in the background (:class:`ReportQueue`) and the sending of
one (:func:`send_report`).

A report goes to the service from one daemon thread with a client of its own
(``REPORT_TIMEOUT`` seconds per phase, no retry), out of a queue of at most ``REPORT_QUEUE``
reports (a full queue drops its oldest report, counted): it never delays or fails the agent's
answer and never keeps the process alive. Closing a queue waits for it at most a bounded time
(``CLOSE_WAIT`` seconds for an adapter's :meth:`~.preparer.Preparer.close`), and the
interpreter's exit waits at most ``EXIT_WAIT`` seconds for every open queue.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from context_assembly_client import Client
from context_assembly_client.integrations.outcomes import AdapterStats, status_note
from context_assembly_client.types import Provider

__all__ = [
    "CLOSE_WAIT",
    "EXIT_WAIT",
    "REPORT_QUEUE",
    "REPORT_TIMEOUT",
    "ReportQueue",
    "UsageReport",
    "normalized_usage",
    "send_report",
]

logger = logging.getLogger("context_assembly_client.integrations")

REPORT_TIMEOUT: Final = 2.0
"""Seconds a usage report may take per phase (connect, send, read); reports are not retried."""

REPORT_QUEUE: Final = 256
"""Usage reports waiting to be sent, at most; a full queue drops its oldest one (counted)."""

CLOSE_WAIT: Final = 5.0
"""Seconds :meth:`Preparer.close` waits for the queued reports before dropping the rest."""

EXIT_WAIT: Final = 2.0
"""Seconds the interpreter's exit waits for the queued reports of every adapter."""

_IDLE: Final = 30.0
"""Seconds the report thread waits for a report before it ends (a later report starts another)."""


def normalized_usage(
    *,
    input_tokens: int | None,
    output_tokens: int | None,
    cached_input_tokens: int | None = None,
    cache_creation_input_tokens: int | None = None,
) -> dict[str, int]:
    """A ``provider="normalized"`` usage object; fields the runtime did not report are left out.

    ``input_tokens`` is every input token the provider processed, cached ones included.
    """
    usage = {
        "provider_input_tokens": input_tokens,
        "cached_input_tokens": cached_input_tokens,
        "cache_creation_input_tokens": cache_creation_input_tokens,
        "output_tokens": output_tokens,
    }
    return {key: value for key, value in usage.items() if isinstance(value, int)}


@dataclass(frozen=True, slots=True)
class UsageReport:
    """One usage report, as :meth:`~.preparer.Preparer.report_usage` queued it."""

    preparation_id: str
    report_id: str
    provider: Provider
    usage: dict[str, Any]
    response_id: str | None
    diagnostics: dict[str, Any] | None


def send_report(client: Callable[[], Client], report: UsageReport, stats: AdapterStats) -> None:
    """Send ``report`` with the reports' client (``client()``); a failure is logged and counted
    in ``stats``, never raised."""
    try:
        client().report_usage(
            report.preparation_id,
            report_id=report.report_id,
            provider=report.provider,
            usage=report.usage,
            response_id=report.response_id,
            diagnostics=report.diagnostics,
        )
    except Exception as err:
        stats.add("usage_report_failures")
        logger.warning(
            "context-assembly: usage report of %s failed (%s%s)",
            report.preparation_id,
            type(err).__name__,
            status_note(err),
        )
    else:
        stats.add("usage_reports")


class ReportQueue:
    """A bounded queue of usage reports and the one daemon thread that sends them.

    The thread is a daemon: it never keeps the process alive. ``put`` drops the oldest queued
    report when the queue is full; ``close`` waits a bounded time, then drops what is left; the
    interpreter's exit waits at most ``EXIT_WAIT`` seconds for every open queue
    (:func:`_drain_at_exit`)."""

    def __init__(
        self, send: Callable[[UsageReport], None], drop: Callable[[int], None], limit: int
    ) -> None:
        self._send = send
        self._drop = drop
        self._limit = limit
        self._queue: deque[UsageReport] = deque()
        self._cond = threading.Condition()
        self._busy = False
        self._thread: threading.Thread | None = None

    def put(self, report: UsageReport) -> None:
        dropped = 0
        with self._cond:
            while len(self._queue) >= self._limit:
                self._queue.popleft()
                dropped += 1
            self._queue.append(report)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._work, name="context-assembly-usage", daemon=True
                )
                self._thread.start()
                _OPEN_QUEUES.add(self)
            self._cond.notify_all()
        if dropped:
            self._drop(dropped)

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                if not self._queue and self._thread is me:
                    self._cond.wait(_IDLE)
                if self._thread is not me:  # closed: the queue was dropped
                    return
                if not self._queue:  # idle: the thread ends, and a later put starts another
                    self._thread = None
                    _OPEN_QUEUES.discard(self)
                    return
                report = self._queue.popleft()
                self._busy = True
            try:
                self._send(report)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._queue) + int(self._busy)

    def wait(self, timeout: float | None) -> bool:
        """Wait until every queued report is sent (or failed); ``False`` at ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def close(self, timeout: float) -> bool:
        """Wait at most ``timeout`` for the queue, then drop what is left and stop the thread (a
        report under way finishes on its own, within its timeout). A later ``put`` starts over."""
        done = self.wait(timeout)
        with self._cond:
            left = len(self._queue)
            self._queue.clear()
            self._thread = None
            self._cond.notify_all()
        _OPEN_QUEUES.discard(self)
        if left:
            self._drop(left)
        return done


_OPEN_QUEUES: weakref.WeakSet[ReportQueue] = weakref.WeakSet()


def _drain_at_exit() -> None:
    """At the interpreter's exit: give every open queue at most ``EXIT_WAIT`` seconds in all."""
    deadline = time.monotonic() + EXIT_WAIT
    for queue in list(_OPEN_QUEUES):
        queue.wait(max(0.0, deadline - time.monotonic()))


atexit.register(_drain_at_exit)
