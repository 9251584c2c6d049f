"""The bridge from a request to the pure core: model profile, counter, clock and rendering.

Both the CLI and the HTTP service run assemblies through here, so they answer the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from context_assembly.core.assemble import Assembly, assemble
from context_assembly.core.budget import resolve_capacity
from context_assembly.core.counting import ModelProfile, TokenCounter
from context_assembly.core.render import render_frame
from context_assembly.core.request import PrepareRequest
from context_assembly.core.result import PrepareResponse
from context_assembly.core.sources import SourceInput, SourceSetup
from context_assembly.errors import InvalidError
from context_assembly.tokens.counter import get_counter
from context_assembly.tokens.registry import ModelRegistry


@dataclass(frozen=True, slots=True)
class ModelContext:
    """What the service knows about the requested model for this request."""

    profile: ModelProfile
    counter: TokenCounter
    exact: bool
    known: bool


def unknown_profile(model: str) -> ModelProfile:
    """The profile of a model the registry does not know: no window, the conservative estimate."""
    return ModelProfile(
        name=model,
        provider="unknown",
        context_window=None,
        max_output_tokens=None,
        tokenizer="estimate",
    )


def model_context(request: PrepareRequest, registry: ModelRegistry) -> ModelContext:
    """Profile and counter for the request; counts are exact only with the model's own tokenizer."""
    found = registry.lookup(request.model)
    profile = found if found is not None else unknown_profile(request.model)
    wanted = request.options.tokenizer
    name = profile.tokenizer if wanted == "auto" else wanted
    exact = name != "estimate" and name == profile.tokenizer
    return ModelContext(profile, get_counter(name), exact, found is not None)


def local_time(now: datetime, timezone: str) -> datetime:
    """``now`` in the request's IANA time zone; an unknown name is an invalid request."""
    try:
        return now.astimezone(ZoneInfo(timezone))
    except (ZoneInfoNotFoundError, ValueError) as err:
        raise InvalidError(f"unknown time zone {timezone!r}", field="timezone") from err


def run_assembly(
    request: PrepareRequest,
    setups: Sequence[SourceSetup],
    inputs: Sequence[SourceInput],
    *,
    now: datetime,
    tenant: str,
    registry: ModelRegistry,
) -> tuple[Assembly, ModelContext]:
    """Assemble ``request`` with the given contributed sources at ``now``."""
    ctx = model_context(request, registry)
    capacity = resolve_capacity(request.max_context_tokens, request.max_context_source, ctx.profile)
    assembly = assemble(
        request,
        setups,
        inputs,
        now=now,
        local_now=local_time(now, request.timezone),
        counter=ctx.counter,
        profile=ctx.profile,
        capacity=capacity,
        exact=ctx.exact,
        tenant=tenant,
    )
    return assembly, ctx


def to_response(
    request: PrepareRequest,
    assembly: Assembly,
    ctx: ModelContext,
    *,
    preparation_id: str,
    expires_at: datetime,
    attempt: int = 1,
) -> PrepareResponse:
    """The wire response, with the frame rendered for the requested provider shape."""
    return PrepareResponse(
        preparation_id=preparation_id,
        model=request.model,
        layout=request.options.layout,
        render=request.render,
        frame=render_frame(
            assembly.frame, request.render, request.model, ctx.profile.max_output_tokens
        ),
        budget=assembly.budget,
        selection=assembly.selection,
        fingerprint=assembly.fingerprint,
        prefix_hash=assembly.prefix_hash,
        prefix_tokens=assembly.prefix_tokens,
        input_hash=assembly.input_hash,
        expires_at=rfc3339(expires_at),
        attempt=attempt,
    )


def rfc3339(moment: datetime) -> str:
    """UTC RFC 3339 with millisecond precision and a ``Z``."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
