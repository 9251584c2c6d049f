"""What a contributor call is given and what it settles as, shared by the webhook calls
(``calls.py``) and the MCP endpoints (``mcp.py``): the fields of a ``contribute`` packet, the
manifest's source statuses, and the settled outcome of one call.

Outcome statuses (the manifest's source statuses): ``ok``; ``timeout`` (the deadline, or a ``504``
from the contributor); ``error`` (connect failure, reset, non-2xx, redirect, which is never followed);
``invalid`` (not JSON, not ``{revision, blocks}``, a non-JSON content type or a compressed body);
``too_large`` (``Content-Length`` or the streamed body over the cap); ``skipped_deadline`` (no
time left to send); ``rejected`` (an inline URL refused or not resolved under ``omit``,
``preparations/targets.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from context_assembly.contributors.mcp_mapping import Skipped
from context_assembly.core.request import Block, Message, Revision, Scope
from context_assembly.core.sources import SourceFailure

# ``rejected``: an inline URL refused or not resolved under ``omit`` (preparations/targets.py, ``Contributors._call_inline``).
Status = Literal["ok", "timeout", "error", "invalid", "too_large", "skipped_deadline", "rejected"]

# A call with less time than this left before the deadline is not sent: ``skipped_deadline``.
MIN_SEND_SECONDS = 0.001
SKIPPED_CAUSE = "no time left before the deadline"
SKIPPED_FAILURE = SourceFailure("no_time_left", SKIPPED_CAUSE)


@dataclass(frozen=True, slots=True)
class ContributorOutcome:
    """What one contributor call produced; a settled value that nothing changes afterwards."""

    source: str
    status: Status
    duration_ms: float
    revision: Revision | None = None
    blocks: tuple[Block, ...] = ()
    cause: str | None = None
    # Items of an MCP answer that did not become blocks (binary contents), with the reason.
    skipped: tuple[Skipped, ...] = ()
    # The failure classified (``cause`` is its ``detail``); ``None`` for an ``ok`` outcome.
    failure: SourceFailure | None = None

    @property
    def ok(self) -> bool:
        """Whether the contributor answered in time with a valid ``{revision, blocks}``."""
        return self.status == "ok"

    @classmethod
    def failed(
        cls, source: str, status: Status, duration_ms: float, failure: SourceFailure
    ) -> ContributorOutcome:
        """A failed call's outcome: its status, and ``failure`` with its words as the cause."""
        return cls(source, status, duration_ms, cause=failure.detail, failure=failure)


@dataclass(frozen=True, slots=True)
class PacketFields:
    """The parts of a ``contribute`` packet shared by every source of one preparation.

    ``source_token_limits`` maps a source to its ``source_token_limit`` (``null`` when absent);
    ``attempt`` is 1 for prepare and 2 for refresh (it keys the stable ``webhook-id``).
    """

    preparation_id: str
    model: str
    input: Sequence[Message]
    data_budget_tokens: int
    scope: Scope
    deadline_unix_ms: int
    source_token_limits: Mapping[str, int] = field(default_factory=dict)
    attempt: int = 1
