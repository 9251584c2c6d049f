"""The contributor protocol in the OpenAPI document's ``webhooks`` (OpenAPI 3.1): each packet the
service ``POST``s to a contributor or a summarizer, with its headers, and the answer it takes
back (``contributors/packets.py``; docs/contract.md, "Webhook protocol"). Nothing here is
served: FastAPI's webhook router only describes calls the service makes, and the clients
generate their packet types from that description."""

from __future__ import annotations

from typing import Annotated, Any, Final

from fastapi import APIRouter, Header

from context_assembly.contributors.packets import (
    ContributePacket,
    ContributorAnswer,
    RevisionAnswer,
    RevisionPacket,
    SummarizePacket,
    SummaryAnswer,
)

TAG: Final = "Contributor webhooks"

# The operation ids are the packet types, as the routes' are their names.
router = APIRouter(tags=[TAG], generate_unique_id_function=lambda route: route.name)

TimeoutMs = Annotated[
    int,
    Header(
        alias="X-Contributor-Timeout-Ms",
        description="The integer milliseconds left at sending (at least 1): a call still running at "
        "the deadline is cancelled.",
    ),
]
WebhookId = Annotated[
    str,
    Header(
        alias="webhook-id",
        description="Stable for one delivery: derived from the preparation, the source, the "
        "packet type and the attempt (each revision check has its own).",
    ),
]
WebhookTimestamp = Annotated[
    str | None,
    Header(
        alias="webhook-timestamp",
        description="With a registration secret (Standard Webhooks): the Unix seconds the "
        "delivery was signed at.",
    ),
]
WebhookSignature = Annotated[
    str | None,
    Header(
        alias="webhook-signature",
        description="With a registration secret (Standard Webhooks): `v1,` and the base64 "
        'HMAC-SHA256 of `"{webhook-id}.{webhook-timestamp}.{body}"` under the secret\'s key.',
    ),
]

FAILED: Final[dict[int | str, dict[str, Any]]] = {
    "default": {
        "description": "Anything else fails the call: `504` is `timeout`, any other status "
        '`error` (docs/contract.md, "Webhook protocol").'
    }
}


@router.post(
    "contribute",
    response_model=ContributorAnswer,
    summary="A contributor's blocks for a prepare",
    response_description="Exactly `{revision, blocks}`, as JSON.",
    responses=FAILED,
)
def contribute(
    packet: ContributePacket,
    timeout_ms: TimeoutMs,
    webhook_id: WebhookId,
    webhook_timestamp: WebhookTimestamp = None,
    webhook_signature: WebhookSignature = None,
) -> None:
    """During a prepare (and its refresh) the service posts this packet to each webhook
    contributor, all at once, under the prepare's one deadline. Blocks that break the block
    rules, an answer that is not `{revision, blocks}`, one over the size cap or past the deadline
    fail the source, and its failure policy applies."""


@router.post(
    "revision",
    response_model=RevisionAnswer,
    summary="A contributor's current revision",
    response_description="`{revision}` (other members are ignored).",
    responses=FAILED,
)
def revision(
    packet: RevisionPacket,
    timeout_ms: TimeoutMs,
    webhook_id: WebhookId,
    webhook_timestamp: WebhookTimestamp = None,
    webhook_signature: WebhookSignature = None,
) -> None:
    """Validate and repair ask each contributor that entered blocks for its revision again: a
    different one is `revision_changed:<source>`, a failed call `revision_unavailable:<source>`."""


@router.post(
    "summarize",
    response_model=SummaryAnswer,
    summary="A summary of the oldest history",
    response_description="`{summary}`, a non-empty string (other members are ignored).",
    responses=FAILED,
)
def summarize(
    packet: SummarizePacket,
    timeout_ms: TimeoutMs,
    webhook_id: WebhookId,
    webhook_timestamp: WebhookTimestamp = None,
    webhook_signature: WebhookSignature = None,
) -> None:
    """Under `assembly.compaction.mode: "summarize"`, when the compaction decision is `compact`,
    the service posts the history before the latest reply to the registered summarizer, within
    the prepare's deadline; the summary takes those messages' place as one message. A failed
    call does not fail the prepare: the frame is sent uncompacted, with the warning
    `compaction_failed`."""
