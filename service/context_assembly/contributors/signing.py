"""Standard Webhooks signing of outbound contributor calls (docs/contract.md, "Webhook protocol").

Headers follow Standard Webhooks v1.0.0 (standard-webhooks/standard-webhooks
``spec/standard-webhooks.md``): ``webhook-id``, ``webhook-timestamp`` (integer Unix seconds) and
``webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``, computed by the
maintained ``standardwebhooks`` package over the exact body bytes that are sent. Several secrets
give several space-separated signatures (zero-downtime key rotation).

**The ``webhook-id``** is derived, not random, so that it is stable for one logical delivery:
``msg_`` + the first 128 bits (hex) of SHA-256 over ``preparation_id``, ``source``, the call type
(``contribute`` / ``revision``) and the attempt (1 for prepare, 2 for refresh; for revision
checks the caller passes a per-check token). A retried or hedged delivery of the same
contribution carries the same id, so a contributor that deduplicates on it (as the standard
recommends) treats it as one delivery, while a refresh or a later validate is a new one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Literal

from standardwebhooks import Webhook

CallType = Literal["contribute", "revision", "summarize"]


def webhook_id(preparation_id: str, source: str, call: CallType, attempt: int | str) -> str:
    """The stable ``webhook-id`` of one delivery: same inputs, same id; never contains ``.``."""
    material = "\x1f".join((preparation_id, source, call, str(attempt))).encode()
    return "msg_" + hashlib.sha256(material).hexdigest()[:32]


def validate_secret(secret: str) -> None:
    """Raise ``ValueError`` unless ``secret`` is a usable Standard Webhooks secret (``whsec_...``)."""
    try:
        Webhook(secret)
    except Exception as err:  # the library raises binascii.Error or its own error type
        raise ValueError("contributor secret must be 'whsec_' followed by base64") from err


def sign_headers(
    secrets: str | Sequence[str] | None,
    msg_id: str,
    body: bytes,
    *,
    now: datetime | None = None,
) -> dict[str, str]:
    """The Standard Webhooks headers for ``body``: always ``webhook-id``; with secrets also
    ``webhook-timestamp`` and ``webhook-signature`` (one ``v1,`` signature per secret).
    """
    headers = {"webhook-id": msg_id}
    if secrets is None:
        return headers
    keys = [secrets] if isinstance(secrets, str) else list(secrets)
    if not keys:
        return headers
    when = datetime.now(UTC) if now is None else now
    # The library reads the timestamp as UTC wall time (it replaces tzinfo), so normalise first.
    when = when.astimezone(UTC) if when.tzinfo is not None else when.replace(tzinfo=UTC)
    text = body.decode("utf-8")  # the library signs str; UTF-8 round-trips the exact bytes
    headers["webhook-timestamp"] = str(int(when.timestamp()))
    headers["webhook-signature"] = " ".join(
        Webhook(key).sign(msg_id=msg_id, timestamp=when, data=text) for key in keys
    )
    return headers
