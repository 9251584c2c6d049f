"""The request *shape hash*: what a refresh must find unchanged.

Refresh needs the host-side parts of the request to lay the frame out again, and the record does
not keep them; so the refresh body is the whole edited prepare request, and the record keeps the
hash of everything refresh must find unchanged: all but history, input, render and ``cache``,
which a refresh takes from the record (docs/contract.md, "Lifecycle").
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from operator import attrgetter
from typing import Final

import orjson

from context_assembly.core.fingerprint import digest
from context_assembly.core.request import Block, PrepareRequest

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
