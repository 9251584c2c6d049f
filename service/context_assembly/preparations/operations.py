"""The lifecycle operations behind the HTTP routes (docs/api.md; docs/contract.md, "Lifecycle"): prepare, budget, get,
validate, refresh, repair and usage. Routes stay thin; this module does the work.

Routing and native history: the record keeps the *routed* model (validate, repair and usage
check against it; a refresh of a routed preparation stays on it, ``pin_model``) and the
candidate list as requested (a refresh must give the same). With a native history the record
keeps the native descriptor (a refresh must give the same one: the provider-held conversation is
the trusted prefix and the service cannot see it) and the provider-counted tokens, which repair
adds to its own count.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

import structlog

from context_assembly import tracing
from context_assembly.config import Settings
from context_assembly.contributors.client import ContributorClient
from context_assembly.contributors.ssrf import Resolver
from context_assembly.core import cache, calibration
from context_assembly.core.anchor import Anchor
from context_assembly.core.assemble import Assembly
from context_assembly.core.fingerprint import text_hash
from context_assembly.core.pricing import PriceRates
from context_assembly.core.request import PrepareRequest
from context_assembly.core.sources import SourceSetup, materialised_inputs, plan_sources
from context_assembly.engine import (
    ModelContext,
    cache_model,
    local_time,
    model_context,
    rfc3339,
    to_response,
)
from context_assembly.errors import StoreUnavailableError
from context_assembly.lifecycle_models import (
    BudgetResponse,
    PreparationView,
    RepairRequest,
    RepairResponse,
    Timeline,
    TimelineTurn,
    UsageRequest,
    ValidateRequest,
    ValidateResponse,
)
from context_assembly.offload import large_inputs, off_loop, run_assembly_async
from context_assembly.preparations import turns
from context_assembly.preparations.clock import Clock
from context_assembly.preparations.folding import fold
from context_assembly.preparations.record import (
    MAX_SHOWN_ID,
    Prepared,
    StoredPreparation,
    new_preparation_id,
    not_found,
    pointer_data,
    record_of,
)
from context_assembly.preparations.repair import repair_frame
from context_assembly.preparations.staleness import (
    REFRESH_HINT,
    frame_reasons,
    refresh_reasons,
    revision_reasons,
    stale,
)
from context_assembly.preparations.targets import Contributors
from context_assembly.preparations.usage import RecordedUsage, accounting_report, record_usage
from context_assembly.storage import PreparationRecord, Store
from context_assembly.tokens.prices import ModelPrices
from context_assembly.tokens.registry import ModelRegistry

# Compare-and-set rounds of a repair or a refresh's write before it gives up with a 503: each
# round lost means another call wrote the record meanwhile (one refresh at most, or a repair).
WRITE_ATTEMPTS: Final = 5


log = structlog.get_logger("context_assembly.preparations")


@dataclass(frozen=True, slots=True)
class Breakdown:
    """What the breakdown page shows: the stored view, the turn as the timeline has it, the
    names of the plugins whose current content went into the prompt (``None``: a record made
    before they were kept) and the model's minimum cacheable length for the render target."""

    view: PreparationView
    turn: TimelineTurn
    legacy_views: list[str] | None
    min_cacheable_tokens: int | None


@dataclass(frozen=True, slots=True)
class Found:
    """A live record, and what its data means."""

    record: PreparationRecord
    stored: StoredPreparation


@dataclass(frozen=True, slots=True, kw_only=True)
class Round:
    """What a prepare and a refresh of it give the one pipeline they share (``_round``).

    ``budget_ms`` is the contributors' time (a refresh: what the prepare left), ``used_ms`` the
    time already used; ``pinned`` the record's model (a refresh: contributors are told it and
    a routed refresh stays on it); ``history_hashes`` the original history's (a refresh keeps
    them; ``None``: this request's); ``anchor`` the previous turn's provider count, for a
    prepare whose model is counted with the estimate."""

    prep_id: str
    attempt: int
    expires: datetime
    before: turns.Previous
    budget_ms: float
    used_ms: float = 0.0
    pinned: str | None = None
    history_hashes: list[str] | None = None
    anchor: Anchor | None = None  # the previous turn's provider count (``core/anchor.py``)
    calibration: float | None = None  # the estimate's factor (``core/calibration.py``)
    # The previous turn's provider response id, named with ``cache.diagnostics``.
    previous_response: str | None = None


class Preparations:
    """The lifecycle operations; one instance per app, sharing the store and the HTTP client."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        client: ContributorClient,
        registry: ModelRegistry,
        *,
        resolver: Resolver | None = None,
        clock: Clock | None = None,
        cache_key_secret: bytes | None = None,
        prices: ModelPrices | None = None,
    ) -> None:
        self.settings = settings
        # What each model's usage costs (``tokens/prices.py``): the shipped prices by default.
        self.prices = prices if prices is not None else ModelPrices.load(registry)
        # The HMAC key of automatic ``prompt_cache_key``s (``core/cache.py``): the app passes the
        # configured or stored one; an instance built without it keys with a random one.
        self.cache_key_secret = cache_key_secret or os.urandom(32)
        self.store = store
        self.registry = registry
        self.clock = clock or Clock()
        self.contributors = Contributors(settings, client, resolver=resolver, clock=self.clock)

    def reconfigure(
        self,
        settings: Settings,
        registry: ModelRegistry | None = None,
        prices: ModelPrices | None = None,
    ) -> None:
        """Take reloaded settings (contributors, allowlist, limits), the model registry they
        make (``[models."name"]``) and the prices (``[prices."name"]``) for the next calls."""
        self.settings = settings
        if registry is not None:
            self.registry = registry
        if prices is not None:
            self.prices = prices
        self.contributors.reconfigure(settings)

    def _price_of(self, model: str) -> PriceRates | None:
        """A model's rates (``None``: no price), for the compaction decision."""
        found = self.prices.lookup(model)
        return None if found is None else found.rates

    async def aclose(self) -> None:
        """Drop the MCP contributors' sessions; at shutdown, before the client is closed."""
        await self.contributors.aclose()

    # ------------------------------------------------------------------ prepare, budget

    @tracing.traced("prepare")
    async def prepare(
        self, tenant: str, request: PrepareRequest, *, large_body: bool = False
    ) -> Prepared:
        """Run contributors, select, lay out, store the record, answer the frame and manifest.
        ``large_body``: the request's body was large (``offload``: assembled off the loop)."""
        setups = plan_sources(request)
        now = self.clock.now()
        local_time(now, request.timezone)  # an unknown time zone fails before any webhook call
        before = await turns.previous(self.store, tenant, request, self.clock.wall())
        anchor = factor = None
        ctx = model_context(request, self.registry)
        if not ctx.exact:  # estimated counts: the provider's own counts correct them
            anchor = await turns.anchor(self.store, tenant, before, self.clock.wall())
            if request.models is None:
                factor = calibration.factor(await self.store.calibration(tenant, ctx.key))
        step = Round(
            prep_id=new_preparation_id(),
            attempt=1,
            expires=now + timedelta(seconds=self.settings.store.ttl_seconds),
            before=before,
            budget_ms=request.options.timeout_ms,
            anchor=anchor,
            calibration=factor,
            previous_response=await turns.previous_response_id(
                self.store, tenant, before, request, self.clock.wall()
            ),
        )
        prepared, stored = await self._round(tenant, request, setups, step, large_body=large_body)
        data = stored.dump()
        await self.store.put(
            PreparationRecord(
                id=step.prep_id, tenant=tenant, data=data, expires_at=step.expires.timestamp()
            ),
            latest_of=turns.scope_key(tenant, request.scope),
            latest_data=pointer_data(data),  # the pointer carries the turn (``turns.previous``)
        )
        return prepared

    async def _round(
        self,
        tenant: str,
        request: PrepareRequest,
        setups: Sequence[SourceSetup],
        step: Round,
        *,
        large_body: bool,
    ) -> tuple[Prepared, StoredPreparation]:
        """The pipeline of a prepare and of a refresh (``setups``: ``plan_sources(request)``):
        contributors, assembly, the turn's cache plan against ``step.before``, the answer and
        its record (which the caller writes)."""
        compaction_options = request.options.compaction
        summarizer = None
        if compaction_options.summarizer is not None:  # a 422 before any call when unknown
            summarizer = self.contributors.summarizer(tenant, compaction_options.summarizer)
        collected = await self.contributors.collect(
            tenant,
            request,
            setups,
            step.prep_id,
            budget_ms=step.budget_ms,
            attempt=step.attempt,
            model=step.pinned,
        )

        async def assemble(sent: PrepareRequest) -> tuple[Assembly, ModelContext]:
            return await run_assembly_async(
                sent,
                setups,
                collected.inputs,
                large_body=large_body,
                now=self.clock.now(),
                tenant=tenant,
                registry=self.registry,
                pin_model=step.pinned if request.models is not None else None,
                anchor=step.anchor,
                prior=None if step.before.part is None else step.before.part.prior(),
                calibration=step.calibration,
                compacted=step.before.compacted,
                prices=self._price_of,
            )

        assembly, ctx = await assemble(request)
        decided = assembly.selection.compaction
        if summarizer is not None and decided is not None and decided.decision == "compact":
            assembly, ctx = await fold(
                self.contributors,
                request,
                assembly,
                ctx,
                summarizer,
                prep_id=step.prep_id,
                attempt=step.attempt,
                budget_ms=step.budget_ms - collected.used_ms,
                assemble=assemble,
            )
        if not ctx.known:
            log.warning(
                "unknown_model",
                preparation_id=step.prep_id,
                model=ctx.model,
                nearest=list(ctx.nearest),
            )

        def conclude() -> tuple[Prepared, StoredPreparation]:
            # The answer and its record (hashes and dumps of the whole frame): off the loop for
            # a large request, as its assembly was.
            sent = list(assembly.caller_history_hashes)
            facts = cache_model(request, ctx, self.registry)
            minimum = facts.minimum
            turn = cache.turn(
                request,
                assembly,
                model=ctx.model,
                minimum=minimum,
                tenant=tenant,
                previous_preparation_id=step.before.id,
                previous=step.before.digests,
                key_secret=self.cache_key_secret,
                provider=facts.provider,
                explicit=facts.explicit,
                previous_response_id=step.previous_response,
                # The history as the frame sends it (compaction may clear or leave out part).
                history_digests=assembly.conversation_hashes[: len(assembly.history)],
            )
            response = to_response(
                request,
                assembly,
                ctx,
                preparation_id=step.prep_id,
                expires_at=step.expires,
                attempt=step.attempt,
                cache=turn,
            )
            prepared = Prepared.of(response)
            stored = record_of(
                request,
                assembly,
                ctx,
                prepared,
                turn=turns.record_part(
                    request,
                    turn,
                    step.before,
                    self.clock.wall(),
                    assembly=assembly,
                    model=ctx.model,
                    minimum=minimum,
                    explicit=cache.openai_explicit(request.render, facts.provider, facts.explicit),
                ),
                answered=collected.answered(),
                used_ms=step.used_ms + collected.used_ms,
                history_hashes=sent if step.history_hashes is None else step.history_hashes,
            )
            return prepared, stored

        return await off_loop(conclude, large_body or large_inputs(collected.inputs))

    async def budget(
        self, tenant: str, request: PrepareRequest, *, large_body: bool = False
    ) -> BudgetResponse:
        """The budget of what is already materialisable: no contributor is called. The request
        is refused as prepare would refuse it before calling anyone: a registered endpoint that
        this tenant does not have is a 422 here too. An inline URL is not looked up (that
        would be a call of a kind): it is listed as pending, and prepare checks it."""
        setups = plan_sources(request)
        self.contributors.split(tenant, request.contributors)  # raises as prepare would
        inputs = materialised_inputs(request, setups)
        assembly, ctx = await run_assembly_async(
            request,
            setups,
            inputs,
            large_body=large_body,
            now=self.clock.now(),
            tenant=tenant,
            registry=self.registry,
        )
        return BudgetResponse(
            model=ctx.model,
            budget=assembly.budget,
            selection=assembly.selection,
            pending_sources=[s.source for s in setups if s.kind == "webhook"],
        )

    # ------------------------------------------------------------------ get, validate

    async def _record(self, tenant: str, prep_id: str) -> Found:
        if len(prep_id) > MAX_SHOWN_ID:
            raise not_found(prep_id)  # none of ours: not looked up
        record = await self.store.get(tenant, prep_id, self.clock.wall())
        if record is None:
            raise not_found(prep_id)
        return Found(record, StoredPreparation.read(record))

    async def get(self, tenant: str, prep_id: str) -> PreparationView:
        """Manifest, budget, hashes and accounting of one preparation (never block bodies)."""
        return self._view(await self._record(tenant, prep_id))

    @staticmethod
    def _view(found: Found) -> PreparationView:
        return PreparationView.model_validate(
            {
                **found.stored.response.known(),
                "refresh_used": found.record.refresh_used,
                "accounting": accounting_report(found.stored, found.record.accounting),
            }
        )

    async def timeline(self, tenant: str, prep_id: str, before: int | None = None) -> Timeline:
        """A page of the preparation's conversation (``turns.page``)."""
        found = await self._record(tenant, prep_id)
        return await turns.page(self.store, found.record, self.clock.wall(), before)

    async def breakdown(self, tenant: str, prep_id: str) -> Breakdown:
        """What the breakdown page shows of one preparation, from its record alone."""
        found = await self._record(tenant, prep_id)
        part = found.stored.cache
        return Breakdown(
            view=self._view(found),
            turn=turns.timeline_turn(
                found.record, found.stored, None if part is None else part.turn
            ),
            legacy_views=found.stored.legacy_views,
            min_cacheable_tokens=None if part is None else part.min_cacheable_tokens,
        )

    async def _revision_reasons(self, tenant: str, found: Found) -> list[str]:
        timeout_ms = self.settings.limits.validate_timeout_ms
        return await revision_reasons(
            self.contributors, tenant, found.record.id, found.stored, timeout_ms
        )

    async def validate(self, tenant: str, prep_id: str, body: ValidateRequest) -> ValidateResponse:
        """Final dispatch check; raises ``StaleError`` with every reason found."""
        found = await self._record(tenant, prep_id)
        reasons = frame_reasons(found.stored, body.model, body.scope, body.frame, self.clock.now())
        reasons += await self._revision_reasons(tenant, found)
        if reasons:
            raise stale(reasons, prep_id)
        return ValidateResponse(preparation_id=prep_id, checked_at=rfc3339(self.clock.now()))

    # ------------------------------------------------------------------ refresh

    @tracing.traced("refresh")
    async def refresh(
        self, tenant: str, prep_id: str, request: PrepareRequest, *, large_body: bool = False
    ) -> Prepared:
        """One more contribution + selection round after host hooks edited history/input."""
        found = await self._record(tenant, prep_id)
        claim = await self.store.claim_refresh(tenant, prep_id, self.clock.wall())
        if claim == "missing":
            raise not_found(prep_id)
        if claim == "used":
            raise stale(["refresh_used"], prep_id)
        stored = found.stored
        reasons = refresh_reasons(stored, request)
        if reasons:
            raise stale(reasons, prep_id, hint=REFRESH_HINT)
        # A refresh is the same turn: the original's ``cache`` object and previous turn.
        request = request.model_copy(update={"cache": turns.stored_options(stored)})
        before = await turns.load(
            self.store, tenant, turns.stored_previous(stored), self.clock.wall()
        )
        step = Round(
            prep_id=prep_id,
            attempt=2,
            expires=datetime.fromtimestamp(found.record.expires_at, UTC),
            before=before,
            budget_ms=stored.timeout_ms - stored.used_ms,
            used_ms=stored.used_ms,
            pinned=stored.model,
            history_hashes=stored.history_hashes,
            previous_response=await turns.previous_response_id(
                self.store, tenant, before, request, self.clock.wall()
            ),
        )
        setups = plan_sources(request)
        prepared, new = await self._round(tenant, request, setups, step, large_body=large_body)
        await self._replace(tenant, found, new, latest_of=turns.scope_key(tenant, request.scope))
        return prepared

    async def _replace(
        self,
        tenant: str,
        found: Found,
        new: StoredPreparation,
        latest_of: str | None = None,
    ) -> None:
        """Write ``new`` over the record by compare and set; when a repair wrote in between,
        carry its estimate over and write again over what it left. With ``latest_of`` the
        scope's pointer, while it names the record, takes the new turn."""
        current = found
        for _ in range(WRITE_ATTEMPTS):
            estimate = current.stored.repair_estimated_input_tokens
            data = new.model_copy(update={"repair_estimated_input_tokens": estimate}).dump()
            if await self.store.replace_data(
                tenant,
                found.record.id,
                data,
                self.clock.wall(),
                expected_version=current.record.version,
                latest_of=latest_of,
                latest_data=pointer_data(data),
            ):
                return
            current = await self._record(tenant, found.record.id)
        raise StoreUnavailableError(f"preparation {found.record.id} kept changing; retry")

    # ------------------------------------------------------------------ repair

    async def repair(self, tenant: str, prep_id: str, body: RepairRequest) -> RepairResponse:
        """A formatting/repair frame over the frozen dispatched frame; contributors not called.

        The repair frame's estimate is written only over the record its checks read (compare and
        set on the record's version): when a refresh or another repair wrote in between, the
        checks run again on what the record holds then, so a repair never undoes a refresh.
        """
        for _ in range(WRITE_ATTEMPTS):
            found = await self._record(tenant, prep_id)
            stored = found.stored
            reasons = frame_reasons(stored, body.model, body.scope, body.frame, self.clock.now())
            if text_hash(body.instructions) != stored.instructions_hash:
                reasons.append("instructions_changed")
            reasons += await self._revision_reasons(tenant, found)
            if reasons:
                raise stale(reasons, prep_id)
            frame = repair_frame(body, stored, self.registry)
            repaired = stored.model_copy(update={"repair_estimated_input_tokens": frame.tokens})
            if await self.store.replace_data(
                tenant,
                prep_id,
                repaired.dump(),
                self.clock.wall(),
                expected_version=found.record.version,
            ):
                return RepairResponse(
                    preparation_id=prep_id,
                    frame=frame.rendered,
                    estimated_input_tokens=frame.tokens,
                )
        raise StoreUnavailableError(
            f"preparation {prep_id} kept changing while the repair was checked; retry"
        )

    # ------------------------------------------------------------------ usage

    @tracing.traced("usage")
    async def usage(self, tenant: str, prep_id: str, body: UsageRequest) -> RecordedUsage:
        """Record one provider usage report; the same ``report_id`` twice changes nothing
        (``usage.record_usage``)."""
        found = await self._record(tenant, prep_id)
        return await record_usage(
            self.store,
            tenant,
            prep_id,
            found.record,
            found.stored,
            body,
            prices=self.prices,
            clock=self.clock,
            max_reports=self.settings.limits.max_usage_reports,
        )
