"""Defaults of the clients: timeouts, retry policy and header names, in one place."""

from __future__ import annotations

import httpx

DEFAULT_TIMEOUT = httpx.Timeout(timeout=60.0, connect=5.0)
"""Per-phase timeout of one attempt. A prepare is bounded by its own ``assembly.timeout_ms``
(at most 30 s of contributor time), so a minute leaves room for selection and a slow network."""

DEFAULT_MAX_RETRIES = 2
"""Retries after the first attempt, for retry-safe calls only (see ``_retry.should_retry``)."""

INITIAL_RETRY_DELAY = 0.5
"""Seconds before the first retry; doubles on each further retry."""

MAX_RETRY_DELAY = 8.0
"""Cap of the exponential backoff, in seconds."""

MAX_RETRY_AFTER = 60.0
"""A server's ``Retry-After`` is obeyed only when it asks for more than 0 and at most this long."""

RETRYABLE_STATUSES = frozenset({502, 503, 504})
"""Statuses worth retrying: a proxy or the store being briefly unavailable. The service's own 502
and 504 (``CONTRIBUTOR_FAILED``, ``CONTEXT_ASSEMBLY_TIMEOUT``) only reach this set on calls that
are already retry-safe, which never call contributors."""

PROBLEM_JSON = "application/problem+json"
USER_AGENT = "context-assembly-client/0.1.0"
