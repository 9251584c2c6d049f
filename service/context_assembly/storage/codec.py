"""How record parts become bytes and back (orjson), shared by the SQLite and Redis backends.

Stored shapes (identical in both backends, so a record means the same thing wherever it lives):

- ``data``: the JSON object the caller gave.
- an observation (``last`` / ``auxiliary``): a JSON object, or absent/NULL for ``None``.
- a per-report answer: the JSON array ``[last, auxiliary]`` as it stood right after the report
  was applied. Both backends build it by concatenating the observation JSON they already hold, so
  the Redis Lua script never parses or re-encodes JSON (``cjson`` would reformat numbers and turn
  ``[]`` into ``{}``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from context_assembly.storage.base import Accounting, Observation, Slot


def check_slot(slot: str) -> Slot:
    """Reject anything but ``last``/``auxiliary`` before it can reach a column or field name."""
    if slot == "last":
        return "last"
    if slot == "auxiliary":
        return "auxiliary"
    raise ValueError(f"unknown accounting slot {slot!r}")


def dump_object(value: Mapping[str, Any]) -> bytes:
    """Serialise a JSON object (``data`` or an observation); non-JSON values raise ``TypeError``."""
    # OPT_NON_STR_KEYS is deliberately off: a non-string key is a caller bug, not something to
    # coerce silently. orjson raises orjson.JSONEncodeError, which is a TypeError.
    return orjson.dumps(dict(value))


def load_object(raw: bytes | str) -> dict[str, Any]:
    """Parse a stored JSON object."""
    value = orjson.loads(raw)
    if not isinstance(value, dict):
        raise ValueError("stored value is not a JSON object")
    return value


def load_observation(raw: bytes | str | None) -> Observation | None:
    """Parse a stored observation; absent (``None``) or empty means no observation yet."""
    if not raw:
        return None
    return load_object(raw)


def encode_answer(last: bytes | None, auxiliary: bytes | None) -> bytes:
    """Join the two stored observations into a per-report answer ``[last, auxiliary]``."""
    return b"[" + (last or b"null") + b"," + (auxiliary or b"null") + b"]"


def decode_answer(raw: bytes | str) -> Accounting:
    """Parse a per-report answer back into ``Accounting``."""
    value = orjson.loads(raw)
    if not (isinstance(value, list) and len(value) == 2):
        raise ValueError("stored usage answer is not a [last, auxiliary] pair")
    last, auxiliary = value
    if not (last is None or isinstance(last, dict)) or not (
        auxiliary is None or isinstance(auxiliary, dict)
    ):
        raise ValueError("stored usage answer holds a non-object observation")
    return Accounting(last=last, auxiliary=auxiliary)


def dump_optional(value: Observation | None) -> bytes | None:
    """Serialise an optional observation (``None`` stays ``None``)."""
    return None if value is None else dump_object(value)
