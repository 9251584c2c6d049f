"""The retry policy as pure functions: whether to retry, and how long to wait first.

Only calls that are safe to repeat are ever retried: the ``GET`` calls and ``report_usage``
(the service records one report per ``report_id``, so a repeat changes nothing). ``prepare``,
``budget``, ``validate``, ``refresh`` (allowed once per preparation) and ``repair`` are sent
once: a lost answer to them is reported, not silently repeated.

The shape follows the Stainless SDKs (``_base_client.py``): exponential backoff with jitter,
capped, and a server's ``Retry-After`` obeyed when it is sensible.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime

from context_assembly_client._constants import (
    INITIAL_RETRY_DELAY,
    MAX_RETRY_AFTER,
    MAX_RETRY_DELAY,
    RETRYABLE_STATUSES,
)

__all__ = ["parse_retry_after", "retry_delay", "should_retry"]


def should_retry(
    *,
    retry_safe: bool,
    retries_done: int,
    max_retries: int,
    status_code: int | None,
) -> bool:
    """Whether to send the request again.

    Args:
        retry_safe: the call may be repeated without changing the outcome (GETs, usage reports).
        retries_done: retries already made (0 after the first attempt).
        max_retries: the client's limit.
        status_code: the answer's status, or ``None`` when there was no answer (a connection
            error or a timeout).

    Returns:
        ``True`` for a retry-safe call with retries left that got no answer or a 502/503/504.
    """
    if not retry_safe or retries_done >= max_retries:
        return False
    return status_code is None or status_code in RETRYABLE_STATUSES


def parse_retry_after(
    headers: Mapping[str, str], now: Callable[[], float] = time.time
) -> float | None:
    """Seconds a server asked to wait, from ``retry-after-ms`` or ``Retry-After``, else ``None``.

    ``Retry-After`` is either delay-seconds or an HTTP date (RFC 9110, section 10.2.3);
    ``retry-after-ms`` is the millisecond variant some APIs send. Unparseable values count as
    absent.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    millis = lowered.get("retry-after-ms")
    if millis is not None:
        try:
            return float(millis) / 1000.0
        except ValueError:
            pass
    value = lowered.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return when.timestamp() - now()


def retry_delay(
    retries_done: int,
    headers: Mapping[str, str] | None = None,
    *,
    rand: Callable[[], float] = random.random,
    now: Callable[[], float] = time.time,
) -> float:
    """Seconds to wait before retry number ``retries_done + 1``.

    A ``Retry-After`` between 0 (exclusive) and ``MAX_RETRY_AFTER`` seconds is obeyed as is.
    Otherwise ``INITIAL_RETRY_DELAY · 2^retries_done``, capped at ``MAX_RETRY_DELAY``, minus up
    to 25 % jitter so that many clients do not retry in step.
    """
    if headers is not None:
        asked = parse_retry_after(headers, now)
        if asked is not None and 0 < asked <= MAX_RETRY_AFTER:
            return asked
    base = min(INITIAL_RETRY_DELAY * 2.0**retries_done, MAX_RETRY_DELAY)
    return base * (1.0 - 0.25 * rand())
