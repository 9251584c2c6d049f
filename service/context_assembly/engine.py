"""The bridge from a request to the pure core: model profile, counter, clock and rendering.

Both the CLI and the HTTP service run assemblies through here, so they answer the same way.

Managed routing (a request with ``models``) happens here: the first candidate whose window fits
the fixed content, the reserves and the protected closure is assembled with its own capacity,
tokenizer and framing profile (``core/routing.py`` measures the need). When none fits and the
request's ``history_policy`` is ``drop_oldest``, the candidates are tried again in order with
history compaction; when none fits at all the answer is ``CONTEXT_OVERFLOW`` with every
candidate's shortfall (problem extension ``candidates``).

Native history (the provider holds the conversation): the provider's count replaces the history
term, the final frame is counted again (plus that count) against the window, and the manifest
marks the counts as including provider-held state (``exact`` false, ``native_history``,
``budget.provider_counted_tokens``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from context_assembly.core import compaction
from context_assembly.core.anchor import Anchor
from context_assembly.core.assemble import Assembly, assemble_frame
from context_assembly.core.budget import Capacity, resolve_capacity
from context_assembly.core.cache import CacheTurn, Provider, provider_of
from context_assembly.core.counting import ModelProfile, TokenCounter, count_messages, count_tools
from context_assembly.core.pricing import PriceRates
from context_assembly.core.render import OUTPUT_LIMIT_KEYS, output_limit, render_frame
from context_assembly.core.request import PrepareRequest
from context_assembly.core.result import (
    ManifestWarning,
    OutputLimit,
    PrepareResponse,
    RoutingCandidate,
    RoutingReport,
)
from context_assembly.core.routing import RoutingProbe
from context_assembly.core.sources import SourceInput, SourceSetup
from context_assembly.core.transcript import Prior
from context_assembly.errors import ContextOverflowError, InvalidError
from context_assembly.tokens.counter import estimate_counter, get_counter
from context_assembly.tokens.registry import ModelRegistry, scale_fraction


@dataclass(frozen=True, slots=True)
class ModelContext:
    """What the service knows about the requested (or routed) model for this request."""

    model: str  # the model name as requested: ``model``, or the candidate routing chose
    profile: ModelProfile
    counter: TokenCounter
    exact: bool
    known: bool
    # The registry entry the model resolved to (``selection.model_entry``); None when unknown.
    entry: str | None = None
    # For an unknown model: the known names closest to it (the ``unknown_model`` warning).
    nearest: tuple[str, ...] = ()
    # The estimate's calibration factor applied to the counts (``core/calibration.py``).
    calibration: float | None = None

    @property
    def key(self) -> str:
        """The name calibration is kept under: the registry entry, else the model as named."""
        return self.entry if self.entry is not None else self.model


def unknown_profile(model: str) -> ModelProfile:
    """The profile of a model the registry does not know: no window, the conservative estimate."""
    return ModelProfile(
        name=model,
        provider="unknown",
        context_window=None,
        max_output_tokens=None,
        tokenizer="estimate",
    )


def model_context(
    request: PrepareRequest,
    registry: ModelRegistry,
    model: str | None = None,
    *,
    calibration: float | None = None,
) -> ModelContext:
    """Profile and counter for ``model`` (default: the request's); counts are exact only with
    the model's own tokenizer. ``calibration``: the estimate's factor for this model
    (``core/calibration.py``), applied when the counts are estimated."""
    name_ = model if model is not None else request.model_name
    found = registry.lookup(name_)
    profile = found if found is not None else unknown_profile(name_)
    wanted = request.options.tokenizer
    name = profile.tokenizer if wanted == "auto" else wanted
    exact = name != "estimate" and name == profile.tokenizer
    # The estimate of a model whose tokenizer counts more carries the entry's factor, and the
    # calibration's when the provider's counts gave one.
    applied = calibration if name == "estimate" else None
    counter = (
        estimate_counter(scale_fraction(profile.estimate_scale) * scale_fraction(applied or 1.0))
        if name == "estimate"
        else get_counter(name)
    )
    if found is None:
        nearest = tuple(registry.nearest(name_))
        return ModelContext(name_, profile, counter, exact, False, None, nearest, applied)
    return ModelContext(name_, profile, counter, exact, True, found.name, (), applied)


def unknown_model_detail(model: str, nearest: Sequence[str] = ()) -> str:
    """The words of the ``unknown_model`` warning (manifest and log)."""
    near = (
        f"; nearest known names: {', '.join(nearest)}" if nearest else "; no known name is near it"
    )
    return (
        f"model {model!r} is not in the registry (GET /v1/models): its tokens are counted with "
        f"the conservative estimate, and its window is max_context_tokens or the fallback{near}"
    )


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
    pin_model: str | None = None,
    anchor: Anchor | None = None,
    prior: Prior | None = None,
    calibration: float | None = None,
    compacted: compaction.Previous | None = None,
    prices: PriceOf | None = None,
) -> tuple[Assembly, ModelContext]:
    """Assemble ``request`` with the given contributed sources at ``now``.

    A request with ``models`` is routed; ``pin_model`` (refresh) keeps a routed preparation on
    the candidate it was routed to instead of routing again. ``anchor``: the previous turn and
    its provider count (``core/anchor.py``), used where it matches the frame; ``prior``: the
    previous turn of a ``transcript`` (``core/transcript.py``); ``calibration``: the
    estimate's factor for the request's model (not routed ones); ``compacted``: what the
    scope's previous turn recorded of its compaction, and ``prices`` each model's rates, for
    the compaction decision (``core/compaction.py``).
    """
    turn = _Turn(anchor, prior, compacted, prices)
    local_now = local_time(now, request.timezone)
    if request.models is None:
        ctx = model_context(request, registry, calibration=calibration)
        capacity = resolve_capacity(
            request.max_context_tokens, request.max_context_source, ctx.profile
        )
        assembly = _assemble(request, setups, inputs, now, local_now, ctx, capacity, tenant, turn)
    else:
        assembly, ctx = _route(
            request, setups, inputs, now, local_now, tenant, registry, pin_model, turn
        )
    # The answer names the registry entry its counts and window came from (None: unknown).
    selection = assembly.selection.model_copy(update={"model_entry": ctx.entry})
    if ctx.calibration is not None:
        calibrated = assembly.budget.count_source == "estimate"
        budget = assembly.budget.model_copy(
            update={
                "calibration_factor": ctx.calibration,
                "count_source": "calibrated" if calibrated else assembly.budget.count_source,
            }
        )
        assembly = replace(assembly, budget=budget)
    return replace(assembly, selection=selection), ctx


PriceOf = Callable[[str], PriceRates | None]
"""A model's rates by its name (``None``: no price)."""


@dataclass(frozen=True, slots=True)
class _Turn:
    """What the scope's previous turn lends this assembly (``run_assembly``)."""

    anchor: Anchor | None
    prior: Prior | None
    compacted: compaction.Previous | None
    prices: PriceOf | None


def _assemble(
    request: PrepareRequest,
    setups: Sequence[SourceSetup],
    inputs: Sequence[SourceInput],
    now: datetime,
    local_now: datetime,
    ctx: ModelContext,
    capacity: Capacity,
    tenant: str,
    turn: _Turn,
) -> Assembly:
    native = request.native_history
    try:
        assembly = assemble_frame(
            request,
            setups,
            inputs,
            now=now,
            local_now=local_now,
            counter=ctx.counter,
            profile=ctx.profile,
            capacity=capacity,
            exact=ctx.exact and native is None,
            tenant=tenant,
            anchor=turn.anchor,
            prior=turn.prior,
            compacted=turn.compacted,
            price=None if turn.prices is None else turn.prices(ctx.model),
        )
    except ContextOverflowError as err:
        if native is None or "shortfall_tokens" not in err.extensions:
            raise
        # The window overflow of the budget: say that the service cannot compact this history.
        needed = err.extensions["needed_tokens"]
        raise ContextOverflowError(
            f"the request needs {needed} tokens, {native.provider_counted_tokens} of them "
            f"provider-held history that the service cannot compact, but the window is "
            f"{capacity.tokens} (compact on the provider side, or prepare for a larger window)",
            **err.extensions,
        ) from err
    if native is None:
        return assembly
    # The final candidate, counted again as it will be sent (plus the provider-held part).
    frame = assembly.frame
    recount = (
        count_messages(frame.messages, ctx.counter, ctx.profile).tokens
        + count_tools(frame.tools, ctx.counter, ctx.profile)
        + ctx.profile.reply_priming
        + native.provider_counted_tokens
    )
    budget = assembly.budget
    available = capacity.tokens - budget.response_reserve - budget.reasoning_reserve_tokens
    if recount > available:
        raise ContextOverflowError(
            f"the final frame counts {recount} tokens with the provider-held history "
            f"({native.provider_counted_tokens}) but {available} are available in the window "
            f"of {capacity.tokens}",
            capacity=capacity.tokens,
            needed_tokens=recount + capacity.tokens - available,
            shortfall_tokens=recount - available,
        )
    return replace(
        assembly,
        budget=budget.model_copy(
            update={"provider_counted_tokens": native.provider_counted_tokens}
        ),
        selection=assembly.selection.model_copy(
            update={
                "native_history": True,
                "opaque_or_multimodal": assembly.selection.opaque_or_multimodal or native.opaque,
            }
        ),
    )


def _route(
    request: PrepareRequest,
    setups: Sequence[SourceSetup],
    inputs: Sequence[SourceInput],
    now: datetime,
    local_now: datetime,
    tenant: str,
    registry: ModelRegistry,
    pin_model: str | None,
    turn: _Turn,
) -> tuple[Assembly, ModelContext]:
    """``first_fit`` over the candidates (or only ``pin_model``)."""
    names = [pin_model] if pin_model is not None else request.candidates
    probe = RoutingProbe(request, setups, inputs, now=now, local_now=local_now)
    tried: list[tuple[RoutingCandidate, ModelContext, Capacity]] = []
    chosen: tuple[Assembly, ModelContext] | None = None
    for name in names:
        ctx = model_context(request, registry, name)
        capacity = resolve_capacity(None, "host", ctx.profile)
        needed = probe.needed_tokens(ctx.counter, ctx.profile)
        shortfall = max(needed - capacity.tokens, 0)
        candidate = RoutingCandidate(
            model=name,
            capacity=capacity.tokens,
            capacity_source=capacity.source,
            tokenizer=ctx.counter.name,
            fits=shortfall == 0,
            needed_tokens=needed,
            shortfall_tokens=shortfall,
            reason="fits" if shortfall == 0 else "window",
        )
        tried.append((candidate, ctx, capacity))
        if candidate.fits:
            routed = request.model_copy(update={"model": name})
            assembly = _assemble(
                routed, setups, inputs, now, local_now, ctx, capacity, tenant, turn
            )
            chosen = assembly, ctx
            break
    if chosen is None and _may_compact(request):
        for index, (candidate, ctx, capacity) in enumerate(tried):
            routed = request.model_copy(update={"model": candidate.model})
            try:
                assembly = _assemble(
                    routed, setups, inputs, now, local_now, ctx, capacity, tenant, turn
                )
            except ContextOverflowError:
                continue
            tried[index] = (
                candidate.model_copy(update={"reason": "fits_after_compaction"}),
                ctx,
                capacity,
            )
            chosen = assembly, ctx
            break
    candidates = [candidate for candidate, _, _ in tried]
    if chosen is None:
        raise _no_candidate(request, candidates)
    assembly, ctx = chosen
    report = RoutingReport(
        policy=request.routing.policy if request.routing is not None else "first_fit",
        chosen=ctx.model,
        pinned=pin_model is not None,
        candidates=candidates,
    )
    selection = assembly.selection.model_copy(update={"routing": report})
    return replace(assembly, selection=selection), ctx


def _may_compact(request: PrepareRequest) -> bool:
    return (
        request.options.history_policy.mode == "drop_oldest"
        and request.native_history is None
        and bool(request.history_messages)
    )


def _no_candidate(
    request: PrepareRequest, candidates: list[RoutingCandidate]
) -> ContextOverflowError:
    parts = "; ".join(
        f"{c.model} needs {c.needed_tokens} of a {c.capacity}-token window "
        f"(short {c.shortfall_tokens})"
        for c in candidates
    )
    hint = ""
    if request.options.history_policy.mode != "drop_oldest" and request.history_messages:
        hint = " (history_policy 'drop_oldest' may compact history)"
    elif _may_compact(request):
        hint = " (not even after the allowed history compaction)"
    return ContextOverflowError(
        f"no candidate model fits the request: {parts}{hint}",
        candidates=[
            {
                "model": c.model,
                "capacity": c.capacity,
                "capacity_source": c.capacity_source,
                "needed_tokens": c.needed_tokens,
                "shortfall_tokens": c.shortfall_tokens,
            }
            for c in candidates
        ],
    )


def to_response(
    request: PrepareRequest,
    assembly: Assembly,
    ctx: ModelContext,
    *,
    preparation_id: str,
    expires_at: datetime,
    attempt: int = 1,
    cache: CacheTurn | None = None,
) -> PrepareResponse:
    """The wire response, with the frame rendered for the requested provider shape.

    ``cache`` (``core.cache.turn``) adds its directives to the body and its report as
    ``selection.cache`` when the request has a ``cache`` object; otherwise it changes nothing.
    """
    if request.cache is None:
        cache = None
    selection = assembly.selection
    if cache is not None:
        selection = selection.model_copy(update={"cache": cache.report})
    if not ctx.known:
        warning = ManifestWarning(
            code="unknown_model", detail=unknown_model_detail(ctx.model, ctx.nearest)
        )
        selection = selection.model_copy(update={"warnings": [*selection.warnings, warning]})
    budget = assembly.budget
    reserve = budget.response_reserve + budget.reasoning_reserve_tokens
    limit = output_limit(reserve, ctx.profile.max_output_tokens)
    if request.render != "neutral":
        report = OutputLimit(
            parameter=OUTPUT_LIMIT_KEYS[request.render],
            tokens=limit,
            source="reserve" if limit == reserve else "model_maximum",
        )
        selection = selection.model_copy(update={"output_limit": report})
    frame = render_frame(
        assembly.frame,
        request.render,
        ctx.model,
        limit,
        cache.directives if cache is not None else None,
    )
    if selection.compaction is not None:
        compaction.add_native(frame, request.render, selection.compaction.native)
    return PrepareResponse(
        preparation_id=preparation_id,
        model=ctx.model,
        layout=request.options.layout,
        render=request.render,
        frame=frame,
        budget=assembly.budget,
        selection=selection,
        fingerprint=assembly.fingerprint,
        prefix_hash=assembly.prefix_hash,
        prefix_tokens=assembly.prefix_tokens,
        input_hash=assembly.input_hash,
        expires_at=rfc3339(expires_at),
        attempt=attempt,
    )


def cache_minimum(
    request: PrepareRequest, ctx: ModelContext, registry: ModelRegistry
) -> int | None:
    """The minimum cacheable length of the assembled model for the render target's provider
    (``core.cache.turn``'s ``minimum``)."""
    provider = provider_of(request.render, ctx.profile.provider)
    return None if provider is None else registry.min_cacheable_prefix(ctx.model, provider)


@dataclass(frozen=True, slots=True)
class CacheModel:
    """What a cache plan needs of the assembled model (``core.cache.turn``): its minimum
    cacheable length and the provider whose rules apply (``cache_minimum``), and whether it has
    OpenAI's explicit breakpoints (the registry's ``explicit_cache_breakpoints``)."""

    minimum: int | None
    provider: Provider | None
    explicit: bool


def cache_model(request: PrepareRequest, ctx: ModelContext, registry: ModelRegistry) -> CacheModel:
    """The facts of ``CacheModel`` for the assembled model and the render target."""
    provider = provider_of(request.render, ctx.profile.provider)
    minimum = None if provider is None else registry.min_cacheable_prefix(ctx.model, provider)
    return CacheModel(minimum, provider, registry.explicit_cache_breakpoints(ctx.model))


def rfc3339(moment: datetime) -> str:
    """UTC RFC 3339 with millisecond precision and a ``Z``."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
