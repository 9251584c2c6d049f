"""Small shared types: the ``NOT_GIVEN`` sentinel and the accepted timeout values."""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

import httpx


class NotGiven:
    """Marks an argument the caller did not pass, where ``None`` is a meaningful value.

    ``timeout=None`` means "no timeout"; ``timeout=NOT_GIVEN`` (the default) means "the client's
    timeout" (the same idea as httpx's ``USE_CLIENT_DEFAULT``).
    """

    def __bool__(self) -> Literal[False]:
        return False

    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN: Final = NotGiven()

Timeout: TypeAlias = float | httpx.Timeout | None
"""Seconds (every phase), an ``httpx.Timeout``, or ``None`` for no timeout."""
