"""The preparation store's contract: the record value, the result types and the ``Store`` protocol.

A *preparation record* is what ``prepare`` leaves behind for the lifecycle calls (validate,
refresh, repair, usage): an opaque, JSON-able ``data`` dict (manifest, hashes, scope… never block
bodies, instructions or history; the caller guarantees that and the store keeps what it is given;
``preparations/record.py`` says what it means),
the owning tenant, an absolute expiry, the once-only refresh flag, and the usage accounting.

Rules every backend keeps (the contract suite in ``tests/storage`` checks them against each one):

- A record is visible only to its tenant and only while ``now < expires_at``. Unknown, expired and
  another tenant's ids all look the same: ``None`` / ``"missing"`` / ``False``, reached by the same
  path (the same queries or commands, the same round trips), so timing does not tell them apart.
- Nothing ever (re)creates a record except ``put``; an update on a missing or expired record
  changes nothing.
- ``put(record, latest_of=key, latest_data=...)`` also makes the record the latest of ``key`` (a
  digest naming a tenant and scope, never raw values) in the same transaction, with a small
  JSON object of the caller's, the pointer expiring with the record; ``latest`` reads both back
  for the record's tenant only, while the record is live.
- No update moves the expiry.
- ``claim_refresh`` succeeds at most once per record, even with concurrent callers on different
  replicas.
- ``record_usage`` is atomic and idempotent by ``report_id``: a repeated id changes nothing and
  answers exactly what the first call answered. With ``max_reports`` a new id on a record that
  already holds that many reports changes nothing and answers ``"full"``.
- ``secret(name, candidate)`` keeps one server secret per name for good (no expiry): the first
  caller's ``candidate`` is stored, and every caller, on every replica, gets the stored one.
- Connection failures, timeouts and a busy database raise ``StoreUnavailableError`` (retryable,
  503); they never hang past the backend's deadline.

Time is passed in (``now``, unix seconds) so that callers and tests control it; a backend reads no
clock except where its own expiry mechanism needs one (Redis key TTLs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias

Observation: TypeAlias = Mapping[str, Any]
"""One normalised usage observation (``provider``, ``call``, ``report_id``, token counts…)."""

Slot = Literal["last", "auxiliary"]
"""Where an observation goes: ``last`` for ``main``/``wrap_up`` calls, ``auxiliary`` for ``repair``."""

ClaimResult = Literal["claimed", "used", "missing"]
"""``claimed``: this caller owns the one refresh; ``used``: someone already did; ``missing``: no record."""

UsageStatus = Literal["applied", "duplicate", "full", "missing"]


class DuplicatePreparationIdError(RuntimeError):
    """``put`` was given an id that already exists: ids are random, so this is a bug, not a 4xx."""


@dataclass(frozen=True, slots=True)
class Accounting:
    """The last-request observations of one preparation; ``None`` until a report fills a slot."""

    last: Observation | None = None
    auxiliary: Observation | None = None

    def as_dict(self) -> dict[str, Any]:
        """The ``{"last": ..., "auxiliary": ...}`` shape the API shows."""
        return {
            "last": None if self.last is None else dict(self.last),
            "auxiliary": None if self.auxiliary is None else dict(self.auxiliary),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class PreparationRecord:
    """One stored preparation.

    ``version`` is the data version: ``put`` stores 1 (whatever the caller passes is ignored) and
    every successful ``replace_data`` adds one, so a refresh can compare-and-set against the
    version it read. Claims and usage reports do not bump it. ``reports`` maps each applied
    ``report_id`` to the accounting that was answered for it.
    """

    id: str
    tenant: str
    data: Mapping[str, Any]
    expires_at: float
    refresh_used: bool = False
    version: int = 1
    accounting: Accounting = field(default_factory=Accounting)
    reports: Mapping[str, Accounting] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.id or not self.tenant:
            raise ValueError("a preparation record needs a non-empty id and tenant")
        if not math.isfinite(self.expires_at):
            raise ValueError("expires_at must be a finite unix time in seconds")


@dataclass(frozen=True, slots=True)
class Latest:
    """A latest pointer: the record's id and the small object ``put`` kept with it."""

    id: str
    data: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class UsageResult:
    """The outcome of ``record_usage``; ``accounting`` is ``None`` when ``status`` is ``missing``
    or ``full``."""

    status: UsageStatus
    accounting: Accounting | None


class Store(Protocol):
    """Where preparation records live between ``prepare`` and the lifecycle calls.

    Every method may raise ``StoreUnavailableError`` when the backend cannot be reached in time.
    """

    async def put(
        self,
        record: PreparationRecord,
        *,
        latest_of: str | None = None,
        latest_data: Mapping[str, Any] | None = None,
    ) -> None:
        """Create ``record``, expiring at its ``expires_at``. When it returns the record is
        stored (committed, visible to every process and replica sharing the backing); an id that
        already exists, whatever its tenant, raises ``DuplicatePreparationIdError`` first.

        With ``latest_of`` the record becomes the latest of that key (see ``latest``), with
        ``latest_data`` (``{}`` when not given), in the same write; the pointer expires with the
        record."""
        ...

    async def latest(self, tenant: str, latest_of: str, now: float) -> Latest | None:
        """The last record ``put`` with ``latest_of`` by ``tenant`` (its id and the
        ``latest_data`` given with it), while that record is live at ``now``; ``None``
        otherwise (never another tenant's)."""
        ...

    async def get(self, tenant: str, id: str, now: float) -> PreparationRecord | None:
        """The tenant's live record, or ``None`` for unknown, expired or another tenant's id."""
        ...

    async def replace_data(
        self,
        tenant: str,
        id: str,
        data: Mapping[str, Any],
        now: float,
        expected_version: int | None = None,
        *,
        latest_of: str | None = None,
        latest_data: Mapping[str, Any] | None = None,
    ) -> bool:
        """Swap in new ``data`` and bump ``version``, keeping the expiry.

        ``False`` when the record is missing/expired/another tenant's, or when
        ``expected_version`` is given and differs from the stored version. With ``latest_of``,
        a successful swap also replaces the pointer's ``latest_data`` in the same write, when
        the pointer still names this record (a later ``put`` has moved it otherwise).
        """
        ...

    async def claim_refresh(self, tenant: str, id: str, now: float) -> ClaimResult:
        """Atomically set ``refresh_used``; exactly one caller ever gets ``"claimed"``."""
        ...

    async def record_usage(
        self,
        tenant: str,
        id: str,
        report_id: str,
        slot: Slot,
        observation: Observation,
        now: float,
        max_reports: int | None = None,
    ) -> UsageResult:
        """Atomically apply one usage report (see the module docstring for the rules); a new
        ``report_id`` on a record holding ``max_reports`` reports is ``"full"``."""
        ...

    async def secret(self, name: str, candidate: bytes) -> bytes:
        """The server secret ``name``: the stored one, else ``candidate``, stored now."""
        ...

    async def calibration(self, tenant: str, model: str, ratio: float | None = None) -> list[float]:
        """The ratios kept for ``tenant`` on ``model`` (``core/calibration.py``), oldest first,
        after appending ``ratio`` when one is given (at most ``calibration.WINDOW`` kept). They
        never expire: they are figures, no text."""
        ...

    async def calibrations(self, tenant: str) -> dict[str, list[float]]:
        """Every model's kept ratios of ``tenant``."""
        ...

    async def purge_expired(self, now: float) -> int:
        """Delete records expired at ``now``; returns how many (0 where the backend expires itself)."""
        ...

    async def ping(self) -> None:
        """Return if the backend answers within its deadline, else raise ``StoreUnavailableError``."""
        ...

    async def aclose(self) -> None:
        """Release connections and threads; idempotent."""
        ...
