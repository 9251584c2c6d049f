"""What a stored preparation record holds, and the request shape hash refresh compares.

A record (SPEC §10) holds the manifest, budget and hashes of the response, the scope, the model,
hashes of the instructions, of each original history message and of the request's host-side
parts, the revisions of webhook contributors and how to reach each (source and endpoint name or
inline URL, never its instructions), the expiry of entered blocks, the contributor time used, and
the accounting. Never block bodies, instructions, history or input.

Refresh needs the host-side parts of the request to lay the frame out again, and the record does
not keep them; so the refresh body is the whole edited prepare request, and the record keeps the
*shape hash* of everything refresh must find unchanged (all but history, input, render and
``cache``, which a refresh takes from the record).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Final

import orjson
from pydantic import TypeAdapter

from context_assembly.core.assemble import Assembly
from context_assembly.core.fingerprint import digest
from context_assembly.core.memo import blocks_digest
from context_assembly.core.request import ContributorRef, Message, PrepareRequest
from context_assembly.core.result import DecisionTally, PrepareResponse, unpack_block_rows
from context_assembly.engine import ModelContext
from context_assembly.errors import NotFoundError

MAX_SHOWN_ID: Final = 128  # our ids have 29 characters; a caller's path may hold anything
# The record's estimate of the last repair frame (``usage`` with ``call: repair`` is compared
# with it).
REPAIR_ESTIMATE: Final = "repair_estimated_input_tokens"

SHAPE_V2: Final = "shape2:sha256:"
# Every field of a contribution but its blocks (which ``blocks_digest`` covers), in fixed order
# (a test holds these to the model's fields).
CONTRIBUTION_FIELDS: Final = ("source", "revision", "instructions", "recovery_tool")
_contribution_values = attrgetter(*CONTRIBUTION_FIELDS)
# The record's contributor list, dumped in one call.
CONTRIBUTOR_REFS: Final = TypeAdapter(list[ContributorRef])
_REF_FIELDS: Final = {"__all__": {"source", "endpoint", "url"}}


def new_preparation_id() -> str:
    """An unguessable id (144 random bits)."""
    return "prep_" + secrets.token_urlsafe(18)


def not_found(prep_id: str) -> NotFoundError:
    """The 404 of an unknown id (or another tenant's: the same answer), naming the id as sent,
    cut at ``MAX_SHOWN_ID`` characters."""
    shown = prep_id if len(prep_id) <= MAX_SHOWN_ID else prep_id[:MAX_SHOWN_ID] + "…"
    return NotFoundError(f"no preparation {shown!r}", preparation_id=shown)


@dataclass(frozen=True, slots=True)
class Prepared:
    """A prepare or refresh answer: the response, its JSON, and what the record keeps of it.

    ``stored`` is the response without its frame (no text), its block reports packed
    (``result.pack_block_rows``); ``body`` is the HTTP answer.
    """

    response: PrepareResponse
    stored: dict[str, Any]
    body: bytes
    decisions: DecisionTally  # the manifest's decisions by status and reason, for the metrics

    @classmethod
    def of(cls, response: PrepareResponse, assembly: Assembly) -> Prepared:
        """``response`` is ``engine.to_response`` of ``assembly``: its block reports are the
        assembly's, whose packed rows and tally the memo keeps."""
        stored = response.model_dump(mode="json", exclude={"frame": True, "selection": {"blocks"}})
        stored["selection"]["block_rows_z"] = assembly.block_rows
        body = response.model_dump_json().encode()
        return cls(response, stored, body, assembly.block_decisions)


def stored_response(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A record's response as the answer had it (block reports unpacked from their rows)."""
    selection = stored["selection"]
    if "block_rows_z" not in selection:
        return dict(stored)  # a record written before the packed form
    rest = {k: v for k, v in selection.items() if k != "block_rows_z"}
    blocks = unpack_block_rows(selection["block_rows_z"])
    return {**stored, "selection": {"blocks": blocks, **rest}}


def _shape_exclude(request: PrepareRequest) -> set[str]:
    # A single-model request leaves the routing fields out, so its hash is what it was before
    # they existed (records stored by an older replica still refresh).
    # ``cache`` is left out: a refresh keeps the original's cache object (the record's).
    exclude = {"history", "input", "render", "cache"}
    if request.models is None:
        exclude |= {"models", "routing"}
    return exclude


def shape_hash(request: PrepareRequest, digests: Mapping[str, bytes] | None = None) -> str:
    """Hash of everything refresh must find unchanged (all but history, input, render, ``cache``).

    SHA-256 over the canonical JSON (sorted keys) of the request without its contributions, a
    newline, then each contribution's fields and the SHA-256 of its blocks (``blocks_digest``)
    as JSON arrays. ``digests`` (by source) are the assembly's, so a prepare hashes its blocks
    once; a source missing from them is hashed here.
    """
    known = digests or {}
    head = request.model_dump(mode="json", exclude=_shape_exclude(request) | {"contributions"})
    hasher = hashlib.sha256(orjson.dumps(head, option=orjson.OPT_SORT_KEYS))
    hasher.update(b"\n")
    hasher.update(
        orjson.dumps(
            [
                (
                    *_contribution_values(item),
                    (known.get(item.source) or blocks_digest(item.blocks)).hex(),
                )
                for item in request.contributions
            ]
        )
    )
    return SHAPE_V2 + hasher.hexdigest()


def shape_hash_v1(request: PrepareRequest) -> str:
    """The shape hash of records stored before ``SHAPE_V2``: the sorted dump of it all."""
    return digest(request.model_dump(mode="json", exclude=_shape_exclude(request)))


def same_shape(request: PrepareRequest, stored: str) -> bool:
    """Whether ``request`` has the shape hash a record stored (in either version)."""
    if stored.startswith(SHAPE_V2):
        return shape_hash(request) == stored
    return shape_hash_v1(request) == stored


def native(request: PrepareRequest) -> dict[str, Any] | None:
    """The native history descriptor as the record keeps it."""
    described = request.native_history
    return None if described is None else described.model_dump(mode="json")


def message_hashes(messages: Sequence[Message]) -> list[str]:
    return [digest(m.model_dump(mode="json", exclude_none=True)) for m in messages]


def record_data(
    request: PrepareRequest,
    assembly: Assembly,
    ctx: ModelContext,
    prepared: Prepared,
    *,
    answered: Mapping[str, bool],
    used_ms: float,
    history_hashes: list[str] | None = None,
) -> dict[str, Any]:
    """The record of one prepare or refresh. ``answered`` says, for each webhook source called,
    whether it answered; ``history_hashes`` are the original history's (a refresh keeps them)."""
    response = prepared.response
    scope = request.scope.model_dump(mode="json")
    budget = response.budget
    return {
        "response": prepared.stored,
        "model": ctx.model,
        "requested_models": request.candidates,
        "native_history": native(request),
        "scope_hash": digest(scope),
        "scope": scope,
        "render": request.render,
        "input_len": len(request.input),
        "shape_hash": shape_hash(request, dict(assembly.block_digests)),
        "history_hashes": history_hashes
        if history_hashes is not None
        else message_hashes(request.history_messages),
        # Only what validate needs to ask each one for its revision again: never its
        # ``instructions`` (host text the record must not hold, SPEC §10).
        "contributors": CONTRIBUTOR_REFS.dump_python(
            request.contributors, mode="json", exclude_none=True, include=_REF_FIELDS
        ),
        "timeout_ms": request.options.timeout_ms,
        "provider_counted_tokens": budget.provider_counted_tokens or 0,
        "tokenizer": ctx.counter.name,
        "prefix_len": assembly.placed.prefix_len,
        "instructions_hash": assembly.instructions_hash,
        "selected_expiry": [list(item) for item in assembly.selected_expiry],
        # Only sources that answered: a source omitted after a failure contributed nothing,
        # so there is nothing of it for a later revision to make stale.
        "revisions": {s: r for s, r in assembly.revisions if answered.get(s, False)},
        "used_ms": used_ms,
        "capacity": budget.capacity,
        "reserve": budget.response_reserve + budget.reasoning_reserve_tokens,
        "estimated_input_tokens": budget.total_input_tokens,
        REPAIR_ESTIMATE: None,
    }
