"""What a stored preparation record holds, and the request shape hash refresh compares.

A record (docs/contract.md, "Storage") holds the manifest, budget and hashes of the response, the scope, the model,
hashes of the instructions, of each original history message and of the request's host-side
parts, the revisions of called contributors and how to reach each (source and endpoint name or
inline URL, with an inline MCP server's kind, resources and tool; never its instructions), the
expiry of entered blocks, the contributor time used, the names of the plugins whose legacy view
was placed, and the accounting. Never block bodies, instructions, history or input.

Refresh needs the host-side parts of the request to lay the frame out again, and the record does
not keep them; so the refresh body is the whole edited prepare request, and the record keeps the
*shape hash* of everything refresh must find unchanged (all but history, input, render and
``cache``, which a refresh takes from the record).

The response part keeps the manifest's block reports as JSON objects, as the answer has them.
Records written by earlier versions may hold them packed instead (``selection.block_rows_z``);
``stored_response`` reads both, and is the one place that knows the packed form.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Final

import orjson
from pydantic import TypeAdapter

from context_assembly.core.assemble import Assembly
from context_assembly.core.fingerprint import digest, message_hashes
from context_assembly.core.request import Block, ContributorRef, PrepareRequest
from context_assembly.core.result import DecisionTally, PrepareResponse, decision_tally
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
# Every field of a block, in fixed order (a test holds these to the model's fields, so a new
# field cannot be left out of the shape hash).
BLOCK_FIELDS: Final = (
    "id",
    "text",
    "priority",
    "protected",
    "dependencies",
    "expires_at",
    "projection",
)
_block_values = attrgetter(*BLOCK_FIELDS)
# The packed form of the block reports in records of earlier versions: base64 of zlib of one
# JSON array per report, with these fields in this order.
PACKED_ROWS: Final = "block_rows_z"
PACKED_ROW_FIELDS: Final = (
    "source",
    "id",
    "status",
    "reason",
    "tokens",
    "full_tokens",
    "projection_tokens",
    "priority",
    "protected",
    "dependencies",
)
# The record's contributor list, dumped in one call: how to reach each one again for its
# revision (an inline MCP server's kind and what it reads; not its tool's arguments, which
# validate does not send, nor instructions).
CONTRIBUTOR_REFS: Final = TypeAdapter(list[ContributorRef])
_REF_FIELDS: Final = {"__all__": {"source", "endpoint", "url", "kind", "resources", "tool"}}


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

    ``stored`` is the response without its frame (no text); ``body`` is the HTTP answer.
    """

    response: PrepareResponse
    stored: dict[str, Any]
    body: bytes
    decisions: DecisionTally  # the manifest's decisions by status and reason (metrics, trace)

    @classmethod
    def of(cls, response: PrepareResponse) -> Prepared:
        stored = response.model_dump(mode="json", exclude={"frame"})
        body = response.model_dump_json().encode()
        return cls(response, stored, body, decision_tally(response.selection.blocks))


def stored_response(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A record's response as the answer had it (the frame excepted), from a record of this
    version or of an earlier one that kept its block reports packed (``PACKED_ROWS``)."""
    selection = stored["selection"]
    if PACKED_ROWS not in selection:
        return dict(stored)
    rows = orjson.loads(zlib.decompress(base64.b64decode(selection[PACKED_ROWS], validate=True)))
    blocks = [dict(zip(PACKED_ROW_FIELDS, row, strict=True)) for row in rows]
    rest = {k: v for k, v in selection.items() if k != PACKED_ROWS}
    return {**stored, "selection": {"blocks": blocks, **rest}}


def _shape_exclude(request: PrepareRequest) -> set[str]:
    # A single-model request leaves the routing fields out, so its hash is what it was before
    # they existed (records stored by an older replica still refresh).
    # ``cache`` is left out: a refresh keeps the original's cache object (the record's).
    exclude = {"history", "input", "render", "cache"}
    if request.models is None:
        exclude |= {"models", "routing"}
    return exclude


def blocks_digest(blocks: Sequence[Block]) -> bytes:
    """SHA-256 of the blocks' fields as JSON arrays in ``BLOCK_FIELDS`` order: the identity of
    one contribution's blocks in the shape hash (canonical: a block holds no JSON object whose
    key order could vary). Stored shape hashes are made of these digests, so the order is
    ``BLOCK_FIELDS``'s, whatever the model's own."""
    return hashlib.sha256(orjson.dumps([_block_values(b) for b in blocks])).digest()


def shape_hash(request: PrepareRequest) -> str:
    """Hash of everything refresh must find unchanged (all but history, input, render, ``cache``).

    SHA-256 over the canonical JSON (sorted keys) of the request without its contributions, a
    newline, then each contribution's fields and the SHA-256 of its blocks (``blocks_digest``)
    as JSON arrays.
    """
    head = request.model_dump(mode="json", exclude=_shape_exclude(request) | {"contributions"})
    hasher = hashlib.sha256(orjson.dumps(head, option=orjson.OPT_SORT_KEYS))
    hasher.update(b"\n")
    hasher.update(
        orjson.dumps(
            [
                (
                    *_contribution_values(item),
                    blocks_digest(item.blocks).hex(),
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


def legacy_views(request: PrepareRequest, response: PrepareResponse) -> list[str]:
    """The plugins whose current content (a legacy view) went into the prompt: those with
    ``content`` that no source of the request replaces. Names only; the breakdown labels the
    part of the window that holds them."""
    replaced = {source.source for source in response.selection.sources}
    return [p.name for p in request.plugins if p.content and p.name not in replaced]


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
        "shape_hash": shape_hash(request),
        "history_hashes": history_hashes
        if history_hashes is not None
        else message_hashes(request.history_messages),
        # Only what validate needs to ask each one for its revision again: never its
        # ``instructions`` (host text the record must not hold, docs/contract.md, "Privacy").
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
        "legacy_views": legacy_views(request, response),
        "used_ms": used_ms,
        "capacity": budget.capacity,
        "reserve": budget.response_reserve + budget.reasoning_reserve_tokens,
        "estimated_input_tokens": budget.total_input_tokens,
        REPAIR_ESTIMATE: None,
    }
