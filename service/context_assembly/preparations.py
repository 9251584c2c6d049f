"""The preparation lifecycle behind the HTTP routes: prepare, budget, read, validate, refresh,
repair and usage (SPEC §3, §3.3). Routes stay thin; this module does the work.

What a stored record holds (SPEC §10): the manifest, budget and hashes of the response, the
scope, the model, hashes of the instructions, of each original history message and of the
request's host-side parts, the revisions of webhook contributors and how to reach each (source
and endpoint name or inline URL, never its instructions), the expiry of entered blocks, the
contributor time used, and the accounting. Never block bodies, instructions, history or input.

Refresh needs the host-side parts of the request to lay the frame out again, and the record does
not keep them; so the refresh body is the whole edited prepare request (a superset of the
``{model, scope, history, input}`` of SPEC §3.3). The service checks that everything the
preparation trusted is unchanged: the same model and scope, the same instructions, plugins, tools,
options and inline sources (one hash), and the original history as a prefix of the edited one.

Routing and native history: the record keeps the *routed* model (validate, repair and usage
check against it; a refresh of a routed preparation stays on it, ``pin_model``) and the
candidate list as requested (a refresh must give the same). With a native history the record
keeps the native descriptor (a refresh must give the same one: the provider-held conversation is
the trusted prefix and the service cannot see it) and the provider-counted tokens, which repair
adds to its own count (the repair call is sent on top of the same provider-held state).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import operator
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from operator import attrgetter
from typing import Any, Final

import httpx
import orjson
from pydantic import TypeAdapter

from context_assembly import offload
from context_assembly.config import Settings
from context_assembly.contributors.calls import (
    ContributorOutcome,
    ContributorTarget,
    PacketFields,
    Status,
    contribute_all,
    query_revision,
    raise_for_failures,
)
from context_assembly.contributors.ssrf import Resolver, UrlPolicy, check_url
from context_assembly.core.assemble import Assembly
from context_assembly.core.blocks import check_source_blocks, parse_timestamp
from context_assembly.core.counting import count_messages, count_tools
from context_assembly.core.fingerprint import digest, input_hash, prefix_hash, text_hash
from context_assembly.core.frame import Frame
from context_assembly.core.memo import blocks_digest
from context_assembly.core.render import render_frame
from context_assembly.core.request import ContributorRef, Message, PrepareRequest, Revision, Scope
from context_assembly.core.result import (
    BLOCK_REPORTS,
    DecisionTally,
    PrepareResponse,
    decision_tally,
    pack_block_rows,
    unpack_block_rows,
)
from context_assembly.core.sources import (
    SourceInput,
    SourceSetup,
    materialised_inputs,
    plan_sources,
)
from context_assembly.core.usage import accounting_observation, normalize_usage
from context_assembly.engine import (
    ModelContext,
    groundwork_for,
    local_time,
    model_context,
    rfc3339,
    to_response,
)
from context_assembly.errors import (
    AssemblyTimeoutError,
    ContextOverflowError,
    InvalidError,
    NotFoundError,
    StaleError,
    StoreUnavailableError,
    UrlRejectedError,
)
from context_assembly.lifecycle import (
    AccountingReport,
    BudgetResponse,
    PreparationView,
    RepairRequest,
    RepairResponse,
    UsageRequest,
    UsageResponse,
    ValidateRequest,
    ValidateResponse,
)
from context_assembly.storage import Accounting, PreparationRecord, Slot, Store
from context_assembly.tokens.registry import ModelRegistry

REPAIR_PROMPT = (
    "Format your previous answer as a single JSON value{schema}. Reply with the JSON only, "
    "without commentary; do not change the facts of the answer."
)


@dataclass(frozen=True, slots=True)
class Clock:
    """Wall and monotonic clocks, injectable for tests."""

    wall: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.wall(), UTC)


async def _first_error_cancels(*calls: Awaitable[Any]) -> list[Any]:
    """Await ``calls`` concurrently and return their results in order; the first to raise
    cancels the others (their late answers change nothing) and its error is raised."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            if task.done() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        return [task.result() for task in tasks]
    finally:
        for task in tasks:
            task.cancel()


@dataclass(frozen=True, slots=True)
class RecordedUsage:
    """What ``usage`` answers, and whether this call applied the report (``False``: a repeat)."""

    response: UsageResponse
    applied: bool


def new_preparation_id() -> str:
    """An unguessable id (144 random bits)."""
    return "prep_" + secrets.token_urlsafe(18)


MAX_SHOWN_ID = 128  # our ids have 29 characters; a caller's path may hold anything


def not_found(prep_id: str) -> NotFoundError:
    """The 404 of an unknown id (or another tenant's: the same answer), naming the id as sent,
    cut at ``MAX_SHOWN_ID`` characters (a 60 KB path id was echoed twice in the body)."""
    shown = prep_id if len(prep_id) <= MAX_SHOWN_ID else prep_id[:MAX_SHOWN_ID] + "…"
    return NotFoundError(f"no preparation {shown!r}", preparation_id=shown)


# The record's estimate of the last repair frame (``usage`` with ``call: repair`` is compared
# with it).
REPAIR_ESTIMATE: Final = "repair_estimated_input_tokens"
# Compare-and-set rounds of a repair or a refresh's write before it gives up with a 503: each
# round lost means another call wrote the record meanwhile (one refresh at most, or a repair).
REPAIR_ATTEMPTS: Final = 5
# A refused refresh is used up like a failed one (SPEC §3.3), so its error says what the body
# must be: the record cannot lay the frame out again from {model, scope, history, input} alone.
REFRESH_HINT: Final = (
    " (refresh takes the whole prepare request again, with only history and input edited)"
)

SHAPE_V2 = "shape2:sha256:"
# Every field of a contribution but its blocks (which ``blocks_digest`` covers), in fixed order
# (a test holds these to the model's fields).
CONTRIBUTION_FIELDS = ("source", "revision", "instructions", "recovery_tool")
_contribution_values = attrgetter(*CONTRIBUTION_FIELDS)
# The record's contributor list, dumped in one call (a ``model_dump`` each took ~2.5x as long).
CONTRIBUTOR_REFS: Final = TypeAdapter(list[ContributorRef])
_REF_FIELDS: Final = {"__all__": {"source", "endpoint", "url"}}


def _shape_exclude(request: PrepareRequest) -> set[str]:
    # A single-model request leaves the routing fields out, so its hash is what it was before
    # they existed (records stored by an older replica still refresh).
    exclude = {"history", "input", "render"}
    if request.models is None:
        exclude |= {"models", "routing"}
    return exclude


def _request_shape_hash(request: PrepareRequest, digests: Mapping[str, bytes] | None = None) -> str:
    """Hash of everything refresh must find unchanged (all but history, input and render).

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


def _request_shape_hash_v1(request: PrepareRequest) -> str:
    """The shape hash of records stored before ``SHAPE_V2``: the sorted dump of it all."""
    return digest(request.model_dump(mode="json", exclude=_shape_exclude(request)))


def _same_shape(request: PrepareRequest, stored: str) -> bool:
    """Whether ``request`` has the shape hash a record stored (in either version)."""
    if stored.startswith(SHAPE_V2):
        return _request_shape_hash(request) == stored
    return _request_shape_hash_v1(request) == stored


def _native(request: PrepareRequest) -> dict[str, Any] | None:
    native = request.native_history
    return None if native is None else native.model_dump(mode="json")


def _request_part(
    request: PrepareRequest,
    digests: Mapping[str, bytes] | None = None,
    history_hashes: list[str] | None = None,
) -> dict[str, Any]:
    """The fields of a record that depend on the request alone (no contributor answer)."""
    scope = request.scope.model_dump(mode="json")
    return {
        "requested_models": request.candidates,
        "native_history": _native(request),
        "scope_hash": digest(scope),
        "scope": scope,
        "render": request.render,
        "input_len": len(request.input),
        "shape_hash": _request_shape_hash(request, digests),
        "history_hashes": history_hashes
        if history_hashes is not None
        else _message_hashes(request.history_messages),
        # Only what validate needs to ask each one for its revision again: never its
        # ``instructions`` (host text the record must not hold, SPEC §10).
        "contributors": CONTRIBUTOR_REFS.dump_python(
            request.contributors, mode="json", exclude_none=True, include=_REF_FIELDS
        ),
        "timeout_ms": request.options.timeout_ms,
    }


def _message_hashes(messages: Sequence[Message]) -> list[str]:
    return [digest(m.model_dump(mode="json", exclude_none=True)) for m in messages]


# Answers that passed the per-source block rules, by (source, max_block_characters, max_blocks,
# digest of the blocks): a contributor that answers the same blocks turn after turn is checked
# once. Only passes are kept (a failure is checked again, to name its rule); ~250 bytes an entry.
MAX_PASSED_CHECKS: Final = 16_384
PassedChecks = set[tuple[str, int, int, bytes]]


def _check_and_digest(
    outcome: ContributorOutcome,
    request: PrepareRequest,
    digests: dict[str, bytes],
    passed: PassedChecks,
) -> ContributorOutcome:
    """``_check_blocks`` and the digest of the blocks (``memo.blocks_digest``, the memo key): run
    on each answer as it arrives, so the assembly after the last answer has less to do. The
    digest comes first: with the limit the rules read, it says whether these very blocks already
    passed (``passed``), and then the rules are not run again."""
    if not outcome.ok:
        return outcome
    digest_ = blocks_digest(outcome.blocks)
    options = request.options
    key = (outcome.source, options.max_block_characters, options.max_blocks, digest_)
    if key not in passed:
        checked = _check_blocks(outcome, request)
        if not checked.ok:
            return checked
        if len(passed) >= MAX_PASSED_CHECKS:
            passed.clear()
        passed.add(key)
    digests[outcome.source] = digest_
    return outcome


def _check_blocks(outcome: ContributorOutcome, request: PrepareRequest) -> ContributorOutcome:
    """Apply the per-source block rules of SPEC §5.1 to one contributor's answer.

    A contributor whose blocks break them (an empty or over-long id, a control character, text
    over ``max_block_characters``, priority out of range, an unqualified dependency, a bad expiry,
    a duplicate id) gave an invalid answer: the outcome becomes ``invalid`` and its failure policy
    decides (``omit`` drops the source, ``fail`` fails the prepare with CONTRIBUTOR_FAILED), so
    one bad optional contributor cannot break every prepare: over ``max_blocks`` alone, or a
    dependency cycle among its own blocks, is its answer's fault too. Rules across sources (the
    total over ``max_blocks``, a cycle through several sources, protected closures) are checked
    later over all sources together.
    """
    if not outcome.ok:
        return outcome
    try:
        check_source_blocks(outcome.source, outcome.blocks, request.options)
    except InvalidError as err:
        return replace(outcome, status="invalid", blocks=(), cause=f"block rules: {err.detail}")
    return outcome


@dataclass(frozen=True, slots=True)
class Prepared:
    """A prepare or refresh answer: the response, and its JSON serialised once for both uses.

    ``stored`` is the response without its frame (what the record keeps: no text), its block
    reports packed (``result.pack_block_rows``); ``body`` is the HTTP answer. Members
    are placed where splicing is trivial (``selection`` first, its ``blocks`` first, ``frame``
    last): JSON objects are unordered (RFC 8259 §4). A memoised turn serialised the reports once.
    """

    response: PrepareResponse
    stored: bytes
    body: bytes
    decisions: DecisionTally  # the manifest's decisions by status and reason, for the metrics

    @classmethod
    def of(cls, response: PrepareResponse, assembly: Assembly) -> Prepared:
        """Serialise ``response``; the manifest's block reports come from ``assembly``'s JSON when
        the response holds exactly those report objects (a memoised turn serialised them once)."""
        selection = response.selection
        reports = selection.blocks
        if len(reports) == len(assembly.block_reports) and all(
            map(operator.is_, reports, assembly.block_reports)
        ):
            blocks, rows = assembly.block_reports_json, assembly.block_rows
            decisions = assembly.block_decisions
        else:
            blocks, rows = BLOCK_REPORTS.dump_json(reports), pack_block_rows(reports)
            decisions = decision_tally(reports)
        # Each answer is joined once from these parts (slices as views: no copies on the way).
        rest = selection.__pydantic_serializer__.to_json(selection, exclude={"blocks"})
        tail = (b",", memoryview(rest)[1:]) if len(rest) > 2 else (b"}",)
        others = memoryview(
            response.__pydantic_serializer__.to_json(response, exclude={"frame", "selection"})
        )
        if response.render == "neutral":
            frame = assembly.neutral_frame_json  # serialised once, while hashing the frame
        else:
            # orjson: ~2x faster than pydantic's on plain data, and every free-form value of a
            # request was checked to encode again (``request.JsonObject``).
            frame = orjson.dumps(response.frame)
        body = b"".join(
            (
                b'{"selection":{"blocks":',
                blocks,
                *tail,
                b",",
                others[1:-1],
                b',"frame":',
                frame,
                b"}",
            )
        )
        kept = b"".join(
            (b'{"selection":{"block_rows_z":"', rows.encode("ascii"), b'"', *tail, b",", others[1:])
        )
        return cls(response, kept, body, decisions)


def _stored_response(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A record's response as the answer had it (block reports unpacked from their rows)."""
    selection = stored["selection"]
    if "block_rows_z" not in selection:
        return dict(stored)  # a record written before the packed form
    rest = {k: v for k, v in selection.items() if k != "block_rows_z"}
    blocks = unpack_block_rows(selection["block_rows_z"])
    return {**stored, "selection": {"blocks": blocks, **rest}}


@dataclass(frozen=True, slots=True)
class Collected:
    """Contributor results of one round, ready for the core."""

    inputs: list[SourceInput]
    outcomes: list[ContributorOutcome]
    targets: list[ContributorTarget]
    used_ms: float


class Preparations:
    """The lifecycle operations; one instance per app, sharing the store and HTTP client."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        client: httpx.AsyncClient,
        registry: ModelRegistry,
        *,
        resolver: Resolver | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.client = client
        self.registry = registry
        self.resolver = resolver
        self.clock = clock or Clock()
        self.url_policy = UrlPolicy(
            allow=settings.inline_urls.entries(), allow_private=settings.inline_urls.allow_private
        )
        self.passed_checks: PassedChecks = set()

    def reconfigure(self, settings: Settings) -> None:
        """Take reloaded settings (contributors, allowlist, limits) for the next calls."""
        policy = UrlPolicy(
            allow=settings.inline_urls.entries(), allow_private=settings.inline_urls.allow_private
        )
        self.settings, self.url_policy = settings, policy

    # ------------------------------------------------------------------ targets

    def _registered_targets(
        self, tenant: str, refs: Sequence[ContributorRef]
    ) -> tuple[list[ContributorTarget], list[ContributorRef]]:
        """The targets of the registered endpoints among ``refs`` (an endpoint this tenant does
        not have is a 422 naming its index) and the inline refs, whose URLs are checked later."""
        targets: list[ContributorTarget] = []
        inline: list[ContributorRef] = []
        for index, ref in enumerate(refs):
            if ref.endpoint is not None:
                targets.append(self._registered_target(tenant, index, ref))
            else:
                inline.append(ref)
        return targets, inline

    def _registered_target(self, tenant: str, index: int, ref: ContributorRef) -> ContributorTarget:
        conf = self.settings.contributors.get(ref.endpoint or "")
        if conf is None or (conf.tenants is not None and tenant not in conf.tenants):
            raise InvalidError(
                f"contributors.{index}.endpoint: no contributor endpoint named "
                f"{ref.endpoint!r} is registered for this tenant",
                field=f"contributors.{index}.endpoint",
            )
        secret = conf.secret.get_secret_value() if conf.secret is not None else None
        return ContributorTarget(
            source=ref.source,
            url=conf.url,
            secret=secret,
            failure_policy=ref.failure_policy or conf.failure_policy,
            kind="registered",
        )

    async def _inline_target(self, ref: ContributorRef, deadline: float) -> ContributorTarget:
        assert ref.url is not None
        checked = await check_url(
            ref.url,
            self.url_policy,
            self.resolver,
            source=ref.source,
            deadline_monotonic=deadline,
            clock=self.clock.monotonic,
        )
        return ContributorTarget(
            source=ref.source,
            url=ref.url,
            failure_policy=ref.failure_policy or "fail",
            kind="inline",
            checked=checked,
        )

    async def _call_inline(
        self,
        ref: ContributorRef,
        deadline: float,
        call: Callable[[list[ContributorTarget]], Awaitable[list[ContributorOutcome]]],
    ) -> tuple[ContributorTarget | None, ContributorOutcome]:
        """Check one inline URL (its DNS inside the deadline), then call it. A refused or
        unresolved URL, or a lookup past the deadline, raises under ``fail``; under ``omit`` it
        is this source's outcome (``rejected`` or ``timeout``) and the others go on."""
        started = self.clock.monotonic()
        try:
            target = await self._inline_target(ref, deadline)
        except (UrlRejectedError, AssemblyTimeoutError) as err:
            if (ref.failure_policy or "fail") == "fail":
                raise
            status: Status = "rejected" if isinstance(err, UrlRejectedError) else "timeout"
            cause = (
                err.extensions.get("reason") if status == "rejected" else "DNS past the deadline"
            )
            elapsed = (self.clock.monotonic() - started) * 1000.0
            return None, ContributorOutcome(ref.source, status, elapsed, cause=cause)
        [outcome] = await call([target])
        return target, replace(outcome, duration_ms=(self.clock.monotonic() - started) * 1000.0)

    async def _collect(
        self,
        tenant: str,
        request: PrepareRequest,
        setups: Sequence[SourceSetup],
        preparation_id: str,
        *,
        budget_ms: float,
        data_budget: int,
        attempt: int,
        model: str | None = None,
        while_waiting: Callable[[], object] | None = None,
    ) -> Collected:
        """Run the webhook contributors of ``request`` under one deadline of ``budget_ms``.

        Packets name ``model`` (a refresh: the routed model), else the request's model (with
        ``models``: the preferred candidate, as routing runs after the contributions).
        """
        start = self.clock.monotonic()
        deadline = start + max(budget_ms, 0.0) / 1000.0
        targets, inline = self._registered_targets(tenant, request.contributors)
        outcomes: list[ContributorOutcome] = []
        digests: dict[str, bytes] = {}
        if request.contributors:
            # With no time left (a refresh after a slow prepare), every call settles as
            # ``skipped_deadline`` unsent, and each source's failure policy decides as usual.
            fields = PacketFields(
                preparation_id=preparation_id,
                model=model if model is not None else request.model_name,
                input=request.input,
                data_budget_tokens=data_budget,
                scope=request.scope,
                deadline_unix_ms=int((self.clock.wall() + budget_ms / 1000.0) * 1000),
                source_token_limits=request.options.source_token_limits,
                attempt=attempt,
            )
            call = functools.partial(
                contribute_all,
                self.client,
                packet_fields=fields,
                deadline_monotonic=deadline,
                max_response_bytes=self.settings.limits.max_contributor_response_bytes,
                clock=self.clock.monotonic,
                check=functools.partial(
                    _check_and_digest, request=request, digests=digests, passed=self.passed_checks
                ),
                fail_fast=True,
            )
            registered = call(targets, while_waiting=while_waiting)
            if inline:
                # Each inline URL's lookup runs beside the others and the registered calls.
                called = await _first_error_cancels(
                    registered, *(self._call_inline(ref, deadline, call) for ref in inline)
                )
                outcomes = list(called[0])
                for target, outcome in called[1:]:
                    if target is not None:
                        targets.append(target)
                    outcomes.append(outcome)
            else:
                outcomes = await registered
            # A source whose URL was refused or not resolved under ``omit`` has no target and
            # needs no policy: under ``fail`` it has raised already.
            targeted = {t.source for t in targets}
            raise_for_failures([o for o in outcomes if o.source in targeted], targets)
        used_ms = (self.clock.monotonic() - start) * 1000.0
        by_source = {o.source: o for o in outcomes}
        inputs: list[SourceInput] = []
        materialised = {i.setup.source: i for i in materialised_inputs(request, setups)}
        for setup in setups:
            if setup.kind == "webhook":
                outcome = by_source[setup.source]
                inputs.append(
                    SourceInput(
                        setup,
                        outcome.status,
                        outcome.duration_ms,
                        outcome.revision,
                        outcome.blocks,
                        digests.get(setup.source) if outcome.ok else None,
                    )
                )
            else:
                inputs.append(materialised[setup.source])
        return Collected(inputs, outcomes, targets, used_ms)

    # ------------------------------------------------------------------ prepare

    async def prepare(self, tenant: str, request: PrepareRequest) -> Prepared:
        """Run contributors, select, lay out, store the record, answer the frame and manifest."""
        setups = plan_sources(request)
        now = self.clock.now()
        local_time(now, request.timezone)  # an unknown time zone fails before any webhook call
        prep_id = new_preparation_id()
        early: dict[str, Any] = {}

        def early_work() -> None:
            # While the contributors are awaited: the parts no answer changes, so that less is
            # left to do after the last answer. An optimisation only: on any failure the
            # assembly and the record compute (and raise) for themselves.
            try:
                early["groundwork"] = groundwork_for(
                    request, setups, now=now, registry=self.registry
                )
                early["request_part"] = _request_part(request)
            except Exception:
                early.clear()

        collected = await self._collect(
            tenant,
            request,
            setups,
            prep_id,
            budget_ms=request.options.timeout_ms,
            data_budget=request.options.max_data_tokens,
            attempt=1,
            while_waiting=None if offload.large_body() else early_work,
        )
        assembly, ctx = await offload.assemble(
            request,
            setups,
            collected.inputs,
            now=self.clock.now(),
            tenant=tenant,
            registry=self.registry,
            groundwork=early.get("groundwork"),
        )
        expires = now + timedelta(seconds=self.settings.store.ttl_seconds)
        response = to_response(request, assembly, ctx, preparation_id=prep_id, expires_at=expires)
        prepared = Prepared.of(response, assembly)
        data = self._record_data(
            request,
            assembly,
            ctx,
            prepared,
            collected,
            used_ms=collected.used_ms,
            request_part=early.get("request_part"),
        )
        await self.store.put(
            PreparationRecord(id=prep_id, tenant=tenant, data=data, expires_at=expires.timestamp())
        )
        return prepared

    def _record_data(
        self,
        request: PrepareRequest,
        assembly: Assembly,
        ctx: ModelContext,
        prepared: Prepared,
        collected: Collected,
        *,
        used_ms: float,
        history_hashes: list[str] | None = None,
        request_part: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The record: ``request_part`` (``_request_part`` of this request, when it was computed
        while the contributors were awaited) and what the assembly and the answers gave."""
        webhook_sources = {t.source for t in collected.targets}
        failed_sources = {o.source for o in collected.outcomes if not o.ok}
        response = prepared.response
        if request_part is None:
            request_part = _request_part(request, dict(assembly.block_digests), history_hashes)
        return {
            # Serialised once (without the frame) and embedded as is by the store's orjson.
            "response": orjson.Fragment(prepared.stored),
            "model": ctx.model,
            **request_part,
            "provider_counted_tokens": response.budget.provider_counted_tokens or 0,
            "tokenizer": ctx.counter.name,
            "prefix_len": assembly.placed.prefix_len,
            "instructions_hash": assembly.instructions_hash,
            "selected_expiry": [list(item) for item in assembly.selected_expiry],
            # Only sources that answered: a source omitted after a failure contributed nothing,
            # so there is nothing of it for a later revision to make stale.
            "revisions": {
                s: r
                for s, r in assembly.revisions
                if s in webhook_sources and s not in failed_sources
            },
            "used_ms": used_ms,
            "capacity": response.budget.capacity,
            "reserve": response.budget.response_reserve + response.budget.reasoning_reserve_tokens,
            "estimated_input_tokens": response.budget.total_input_tokens,
            REPAIR_ESTIMATE: None,
        }

    async def budget(self, tenant: str, request: PrepareRequest) -> BudgetResponse:
        """The budget of what is already materialisable: no contributor is called. The request
        is refused as prepare would refuse it before calling anyone: a registered endpoint that
        this tenant does not have is a 422 here too. An inline URL is not looked up (that
        would be a call of a kind): it is listed as pending, and prepare checks it."""
        setups = plan_sources(request)
        self._registered_targets(tenant, request.contributors)  # raises as prepare would
        inputs = materialised_inputs(request, setups)
        assembly, ctx = await offload.assemble(
            request, setups, inputs, now=self.clock.now(), tenant=tenant, registry=self.registry
        )
        return BudgetResponse(
            model=ctx.model,
            budget=assembly.budget,
            selection=assembly.selection,
            pending_sources=[s.source for s in setups if s.kind == "webhook"],
        )

    # ------------------------------------------------------------------ reads

    async def _record(self, tenant: str, prep_id: str) -> PreparationRecord:
        if len(prep_id) > MAX_SHOWN_ID:
            raise not_found(prep_id)  # none of ours: not looked up
        record = await self.store.get(tenant, prep_id, self.clock.wall())
        if record is None:
            raise not_found(prep_id)
        return record

    @staticmethod
    def _accounting(record: PreparationRecord) -> AccountingReport:
        acc = record.accounting.as_dict()
        return AccountingReport.model_validate(
            {"estimated_input_tokens": record.data["estimated_input_tokens"], **acc}
        )

    async def get(self, tenant: str, prep_id: str) -> PreparationView:
        """Manifest, budget, hashes and accounting of one preparation (never block bodies)."""
        record = await self._record(tenant, prep_id)
        return self._view(record)

    def _view(self, record: PreparationRecord) -> PreparationView:
        return PreparationView.model_validate(
            {
                **_stored_response(record.data["response"]),
                "refresh_used": record.refresh_used,
                "accounting": self._accounting(record),
            }
        )

    # ------------------------------------------------------------------ staleness

    async def _revision_reasons(self, tenant: str, record: PreparationRecord) -> list[str]:
        stored: Mapping[str, Revision | None] = record.data["revisions"]
        refs = [
            ContributorRef.model_validate(c)
            for c in record.data["contributors"]
            if c["source"] in stored  # sources that failed under "omit" entered nothing to check
        ]
        if not refs:
            return []
        timeout = self.settings.limits.validate_timeout_ms / 1000.0
        deadline = self.clock.monotonic() + timeout
        scope = Scope.model_validate(record.data["scope"])
        reasons: list[str] = []
        targets: list[ContributorTarget] = []
        for ref in refs:
            try:
                # As registered now: a reload that moved or removed a registration applies.
                if ref.endpoint is not None:
                    targets.append(self._registered_target(tenant, 0, ref))
                else:
                    targets.append(await self._inline_target(ref, deadline))
            except (InvalidError, AssemblyTimeoutError, UrlRejectedError):
                # A contributor removed from the configuration (or no longer allowed) since prepare.
                reasons.append(f"revision_unavailable:{ref.source}")
        answers = await asyncio.gather(
            *(
                query_revision(
                    self.client,
                    t,
                    scope,
                    deadline,
                    preparation_id=record.id,
                    clock=self.clock.monotonic,
                )
                for t in targets
            )
        )
        for target, (status, revision) in zip(targets, answers, strict=True):
            if status != "ok":
                reasons.append(f"revision_unavailable:{target.source}")
            elif revision != stored[target.source]:
                reasons.append(f"revision_changed:{target.source}")
        return reasons

    def _frame_reasons(
        self, record: PreparationRecord, model: str, scope: Scope, frame: Frame
    ) -> list[str]:
        data = record.data
        reasons: list[str] = []
        if model != data["model"]:
            reasons.append("model_changed")
        if digest(scope.model_dump(mode="json")) != data["scope_hash"]:
            reasons.append("scope_changed")
        prefix_len: int = data["prefix_len"]
        input_len: int = data["input_len"]
        messages = frame.messages
        if (
            len(messages) < prefix_len
            or prefix_hash(data["model"], messages[:prefix_len], frame.tools)
            != data["response"]["prefix_hash"]
        ):
            reasons.append("prefix_changed")
        tail = messages[len(messages) - input_len :] if input_len else []
        if len(messages) < input_len or input_hash(tail) != data["response"]["input_hash"]:
            reasons.append("input_changed")
        now = self.clock.now()
        for qid, stamp in data["selected_expiry"]:
            moment = parse_timestamp(stamp)
            if moment is not None and moment <= now:
                reasons.append(f"expired:{qid}")
        return reasons

    @staticmethod
    def _stale(reasons: list[str], prep_id: str, hint: str = "") -> StaleError:
        return StaleError(
            f"preparation {prep_id} is stale: {', '.join(reasons)}{hint}",
            reasons=reasons,
            preparation_id=prep_id,
        )

    async def validate(self, tenant: str, prep_id: str, body: ValidateRequest) -> ValidateResponse:
        """Final dispatch check; raises ``StaleError`` with every reason found."""
        record = await self._record(tenant, prep_id)
        reasons = self._frame_reasons(record, body.model, body.scope, body.frame)
        reasons += await self._revision_reasons(tenant, record)
        if reasons:
            raise self._stale(reasons, prep_id)
        return ValidateResponse(preparation_id=prep_id, checked_at=rfc3339(self.clock.now()))

    # ------------------------------------------------------------------ refresh

    async def refresh(self, tenant: str, prep_id: str, request: PrepareRequest) -> Prepared:
        """One more contribution + selection round after host hooks edited history/input."""
        record = await self._record(tenant, prep_id)
        claim = await self.store.claim_refresh(tenant, prep_id, self.clock.wall())
        if claim == "missing":
            raise not_found(prep_id)
        if claim == "used":
            raise self._stale(["refresh_used"], prep_id)
        data = record.data
        reasons: list[str] = []
        if request.candidates != data.get("requested_models", [data["model"]]):
            reasons.append("model_changed")
        if digest(request.scope.model_dump(mode="json")) != data["scope_hash"]:
            reasons.append("scope_changed")
        original: list[str] = data["history_hashes"]
        edited = _message_hashes(request.history_messages[: len(original)])
        if (
            not _same_shape(request, data["shape_hash"])
            or edited != original
            or _native(request) != data.get("native_history")
        ):
            reasons.append("prefix_changed")
        if reasons:
            raise self._stale(reasons, prep_id, hint=REFRESH_HINT)
        setups = plan_sources(request)
        left_ms = float(data["timeout_ms"]) - float(data["used_ms"])
        collected = await self._collect(
            tenant,
            request,
            setups,
            prep_id,
            budget_ms=left_ms,
            data_budget=request.options.max_data_tokens,
            attempt=2,
            model=data["model"],
        )
        assembly, ctx = await offload.assemble(
            request,
            setups,
            collected.inputs,
            now=self.clock.now(),
            tenant=tenant,
            registry=self.registry,
            pin_model=data["model"] if request.models is not None else None,
        )
        expires = datetime.fromtimestamp(record.expires_at, UTC)
        response = to_response(
            request, assembly, ctx, preparation_id=prep_id, expires_at=expires, attempt=2
        )
        prepared = Prepared.of(response, assembly)
        new_data = self._record_data(
            request,
            assembly,
            ctx,
            prepared,
            collected,
            used_ms=float(data["used_ms"]) + collected.used_ms,
            history_hashes=original,
        )
        await self._replace(tenant, record, new_data, keep=(REPAIR_ESTIMATE,))
        return prepared

    # ------------------------------------------------------------------ repair

    async def repair(self, tenant: str, prep_id: str, body: RepairRequest) -> RepairResponse:
        """A formatting/repair frame over the frozen dispatched frame; contributors not called.

        The repair frame's estimate is written only over the record its checks read (compare and
        set on the record's version): when a refresh or another repair wrote in between, the
        checks run again on what the record holds then, so a repair never undoes a refresh.
        """
        for _ in range(REPAIR_ATTEMPTS):
            record = await self._record(tenant, prep_id)
            data = record.data
            reasons = self._frame_reasons(record, body.model, body.scope, body.frame)
            if text_hash(body.instructions) != data["instructions_hash"]:
                reasons.append("instructions_changed")
            reasons += await self._revision_reasons(tenant, record)
            if reasons:
                raise self._stale(reasons, prep_id)
            schema = (
                ""
                if body.schema_ is None
                else (
                    " that matches this JSON Schema: "
                    + orjson.dumps(body.schema_, option=orjson.OPT_SORT_KEYS).decode()
                )
            )
            messages = [
                *body.frame.messages,
                Message(role="assistant", content=body.answer),
                Message(role="user", content=REPAIR_PROMPT.format(schema=schema)),
            ]
            frame = Frame(messages=messages, tools=body.frame.tools)
            probe = PrepareRequest(model=data["model"], assembly={"tokenizer": data["tokenizer"]})
            ctx = model_context(probe, self.registry)
            counted = count_messages(messages, ctx.counter, ctx.profile)
            tokens = (
                counted.tokens
                + count_tools(frame.tools, ctx.counter, ctx.profile)
                + ctx.profile.reply_priming
                + int(data.get("provider_counted_tokens", 0))  # native history: the provider's
            )
            available = int(data["capacity"]) - int(data["reserve"])
            if tokens > available:
                raise ContextOverflowError(
                    f"the repair frame needs {tokens} tokens but {available} are available",
                    needed_tokens=tokens,
                    capacity=data["capacity"],
                )
            if await self.store.replace_data(
                tenant,
                prep_id,
                {**data, REPAIR_ESTIMATE: tokens},
                self.clock.wall(),
                expected_version=record.version,
            ):
                rendered = render_frame(
                    frame, data["render"], data["model"], ctx.profile.max_output_tokens
                )
                return RepairResponse(
                    preparation_id=prep_id, frame=rendered, estimated_input_tokens=tokens
                )
        raise StoreUnavailableError(
            f"preparation {prep_id} kept changing while the repair was checked; retry"
        )

    async def _replace(
        self,
        tenant: str,
        record: PreparationRecord,
        new_data: Mapping[str, Any],
        keep: tuple[str, ...] = (),
    ) -> None:
        """Write ``new_data`` over ``record`` by compare and set; when another call wrote in
        between, carry its ``keep`` fields over and write again over what it left."""
        current = record
        for _ in range(REPAIR_ATTEMPTS):
            data = dict(new_data)
            for name in keep:
                if name in current.data:
                    data[name] = current.data[name]
                else:
                    data.pop(name, None)
            if await self.store.replace_data(
                tenant, record.id, data, self.clock.wall(), expected_version=current.version
            ):
                return
            current = await self._record(tenant, record.id)
        raise StoreUnavailableError(f"preparation {record.id} kept changing; retry")

    # ------------------------------------------------------------------ usage

    async def usage(self, tenant: str, prep_id: str, body: UsageRequest) -> RecordedUsage:
        """Record one provider usage report; the same ``report_id`` twice changes nothing.

        A ``report_id`` the record already holds is answered from it before the body is read
        again, so a repeat answers the same whatever it carries. A new one over
        ``limits.max_usage_reports`` for this preparation is refused (422): the reports are
        kept for idempotency and every lifecycle call reads them.
        """
        record = await self._record(tenant, prep_id)
        data = record.data
        seen = record.reports.get(body.report_id)
        if seen is not None:
            return RecordedUsage(self._usage_response(prep_id, data, seen), applied=False)
        normalized = normalize_usage(body.provider, body.usage)
        estimate = data["estimated_input_tokens"]
        if body.call == "repair" and data.get(REPAIR_ESTIMATE) is not None:
            estimate = data[REPAIR_ESTIMATE]
        observation = accounting_observation(
            normalized,
            int(estimate),
            body.provider,
            body.call,
            body.report_id,
            rfc3339(self.clock.now()),
        )
        slot: Slot = "auxiliary" if body.call == "repair" else "last"
        limit = self.settings.limits.max_usage_reports
        result = await self.store.record_usage(
            tenant, prep_id, body.report_id, slot, observation, self.clock.wall(), max_reports=limit
        )
        if result.status == "full":
            raise InvalidError(
                f"preparation {prep_id} already holds {limit} usage reports"
                " (limits.max_usage_reports)",
                max_usage_reports=limit,
            )
        if result.status == "missing" or result.accounting is None:
            raise not_found(prep_id)
        return RecordedUsage(
            self._usage_response(prep_id, data, result.accounting),
            applied=result.status == "applied",
        )

    @staticmethod
    def _usage_response(
        prep_id: str, data: Mapping[str, Any], accounting: Accounting
    ) -> UsageResponse:
        report = AccountingReport.model_validate(
            {"estimated_input_tokens": data["estimated_input_tokens"], **accounting.as_dict()}
        )
        return UsageResponse(preparation_id=prep_id, accounting=report)

    # ------------------------------------------------------------------ breakdown

    async def view(self, tenant: str, prep_id: str) -> PreparationView:
        """The stored view used by the breakdown page."""
        return await self.get(tenant, prep_id)


__all__ = ["Clock", "Preparations", "RecordedUsage", "new_preparation_id"]
