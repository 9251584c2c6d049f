"""How an adapter accounts for what it did: its counters (:class:`AdapterStats`), and its
failures told apart (:func:`is_mapping_bug`) and described for its warnings (:func:`where`,
:func:`status_note`), with ids, statuses, error classes and code locations, never texts."""

from __future__ import annotations

import threading
import traceback
from dataclasses import dataclass, field

from context_assembly_client import APIStatusError, ContextAssemblyError
from context_assembly_client.integrations.frames import IntegrationError

__all__ = ["AdapterStats", "is_mapping_bug", "status_note", "where"]


@dataclass
class AdapterStats:
    """What an adapter did, counted since it was made (read them; the adapter writes them)."""

    prepared: int = 0
    """Model calls that went out with a frame."""
    failed_open: int = 0
    """Model calls that went out unchanged because the preparation failed."""
    usage_reports: int = 0
    """Usage reports the service accepted."""
    usage_report_failures: int = 0
    """Usage reports that failed (logged, never raised)."""
    usage_reports_dropped: int = 0
    """Usage reports never sent: dropped from a full queue, or left when the adapter closed."""
    cache_markers_skipped: int = 0
    """Anthropic markers of a plan that the runtime's types, or the model's class, had no place
    for."""
    mapping_errors: int = 0
    """Failures of the adapter's own mapping (logged with where they happened; the call went on
    unchanged, or its usage was not reported)."""
    native_compaction_skipped: int = 0
    """Calls of ``mode: "native"`` whose model class has no place for the provider's compaction:
    they went out without it (warned once per adapter)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str, count: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + count)


def where(err: BaseException, limit: int = 8) -> str:
    """Where ``err`` was raised: the innermost ``limit`` frames of its traceback as
    ``module:line function``, innermost last; never the exception's message."""
    frames = [
        f"{frame.f_globals.get('__name__', '?')}:{line} {frame.f_code.co_name}"
        for frame, line in traceback.walk_tb(err.__traceback__)
    ]
    return " < ".join(reversed(frames[-limit:])) or "no traceback"


def is_mapping_bug(err: BaseException) -> bool:
    """An error of the adapter's own mapping, not of the service or the network: a frame that does
    not match what was sent (:class:`IntegrationError`), or any exception that is neither a client
    error nor the deadline."""
    if isinstance(err, IntegrationError):
        return True
    return not isinstance(err, ContextAssemblyError | TimeoutError)


def status_note(err: Exception) -> str:
    """The status, error code and request id of a service's error answer, for a warning (``""``
    for any other error)."""
    if isinstance(err, APIStatusError):
        code = f" {err.code}" if err.code else ""
        return f", status {err.status_code}{code}, request {err.request_id}"
    return ""
