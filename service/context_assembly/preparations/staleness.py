"""Why a stored preparation no longer holds: the reasons validate, repair and refresh refuse with.

Validate and repair compare the frame about to be sent with the record (model, scope, prefix,
input, expiry of entered blocks) and ask each contributor that answered for its revision again;
refresh compares the edited request with what the preparation trusted (model, scope, the request
shape hash, the original history as a prefix, the native history descriptor). Every reason found
is named in one ``CONTEXT_ASSEMBLY_STALE`` problem (``StaleError``).
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Final

from context_assembly.contributors.calls import ContributorTarget, query_revision
from context_assembly.core.blocks import parse_timestamp
from context_assembly.core.fingerprint import digest, input_hash, message_hashes, prefix_hash
from context_assembly.core.frame import Frame
from context_assembly.core.request import PrepareRequest, Scope
from context_assembly.errors import AssemblyTimeoutError, InvalidError, StaleError, UrlRejectedError
from context_assembly.preparations.record import StoredPreparation, native
from context_assembly.preparations.shape import same_shape
from context_assembly.preparations.targets import Contributors

# A refused refresh is used up like a failed one (docs/contract.md, "Lifecycle"), so its error says what the body
# must be: the record cannot lay the frame out again from {model, scope, history, input} alone.
REFRESH_HINT: Final = (
    " (refresh takes the whole prepare request again, with only history and input edited)"
)


def stale(reasons: list[str], prep_id: str, hint: str = "") -> StaleError:
    return StaleError(
        f"preparation {prep_id} is stale: {', '.join(reasons)}{hint}",
        reasons=reasons,
        preparation_id=prep_id,
    )


def frame_reasons(
    stored: StoredPreparation, model: str, scope: Scope, frame: Frame, now: datetime
) -> list[str]:
    """What differs between the frame about to be sent and the one the record describes."""
    reasons: list[str] = []
    if model != stored.model:
        reasons.append("model_changed")
    if digest(scope.model_dump(mode="json")) != stored.scope_hash:
        reasons.append("scope_changed")
    prefix_len = stored.prefix_len
    input_len = stored.input_len
    messages = frame.messages
    if (
        len(messages) < prefix_len
        or prefix_hash(stored.model, messages[:prefix_len], frame.tools)
        != stored.response.prefix_hash
    ):
        reasons.append("prefix_changed")
    tail = messages[len(messages) - input_len :] if input_len else []
    if len(messages) < input_len or input_hash(tail) != stored.response.input_hash:
        reasons.append("input_changed")
    for qid, stamp in stored.selected_expiry:
        moment = parse_timestamp(stamp)
        if moment is not None and moment <= now:
            reasons.append(f"expired:{qid}")
    return reasons


async def revision_reasons(
    contributors: Contributors,
    tenant: str,
    prep_id: str,
    stored: StoredPreparation,
    timeout_ms: float,
) -> list[str]:
    """Each contributor that entered blocks, asked for its revision again (as registered now:
    a reload that moved or removed a registration applies), within ``timeout_ms`` in all."""
    revisions = stored.revisions
    refs = [
        ref
        for ref in stored.contributor_refs()
        if ref.source in revisions  # sources that failed under "omit" entered nothing to check
    ]
    if not refs:
        return []
    clock = contributors.clock
    deadline = clock.monotonic() + timeout_ms / 1000.0
    scope = stored.scope
    reasons: list[str] = []
    targets: list[ContributorTarget] = []
    for ref in refs:
        try:
            if ref.endpoint is not None:
                targets.append(contributors.registered(tenant, 0, ref))
            else:
                targets.append(await contributors.inline(ref, deadline))
        except (InvalidError, AssemblyTimeoutError, UrlRejectedError):
            # A contributor removed from the configuration (or no longer allowed) since prepare.
            reasons.append(f"revision_unavailable:{ref.source}")
    # An MCP source may read whole resources again to hash them: its answers have the
    # contributor answer cap; a webhook's ``{revision}`` keeps query_revision's small one.
    mcp_cap = {"max_response_bytes": contributors.settings.limits.max_contributor_response_bytes}
    answers = await asyncio.gather(
        *(
            query_revision(
                contributors.client,
                target,
                scope,
                deadline,
                preparation_id=prep_id,
                clock=clock.monotonic,
                **(mcp_cap if target.mcp is not None else {}),
            )
            for target in targets
        )
    )
    for target, (status, revision) in zip(targets, answers, strict=True):
        if status != "ok":
            reasons.append(f"revision_unavailable:{target.source}")
        elif revision != revisions[target.source]:
            reasons.append(f"revision_changed:{target.source}")
    return reasons


def refresh_reasons(stored: StoredPreparation, request: PrepareRequest) -> list[str]:
    """What the edited ``request`` changed of what the preparation trusted: the same model (or
    candidates) and scope, the same shape (instructions, plugins, tools, options, inline
    sources), the original history as a prefix of the edited one, the same native history."""
    reasons: list[str] = []
    if request.candidates != stored.requested_models:
        reasons.append("model_changed")
    if digest(request.scope.model_dump(mode="json")) != stored.scope_hash:
        reasons.append("scope_changed")
    original = stored.history_hashes
    edited = message_hashes(request.history_messages[: len(original)])
    if (
        not same_shape(request, stored.shape_hash)
        or edited != original
        or native(request.native_history) != native(stored.native_history)
    ):
        reasons.append("prefix_changed")
    return reasons
