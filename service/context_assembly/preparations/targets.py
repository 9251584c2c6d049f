"""Where each contributor of a request is called, and the calls of one round under one deadline.

A contributor names a registered endpoint (the configuration's URL and secret, for the tenants it
lists) or an inline URL, which is checked against the allowlist and the private ranges, its DNS
inside the deadline (``contributors/ssrf.py``). :meth:`Contributors.collect` calls them all at
once and checks each answer against the per-source block rules as it arrives. A registered
endpoint of ``kind = "mcp"`` is an MCP server: its target carries the tenant's endpoint (and
session) from :class:`~context_assembly.contributors.mcp.McpEndpoints`; an inline URL with
``kind: "mcp"`` gets an endpoint of its own for the call, pinned to the checked addresses. The
sources go to the core with their kind (``mcp`` for an MCP server, which the request alone does
not say of a registered endpoint), the items an MCP server offered that are no blocks, and why a
source failed (its ``SourceFailure``). A source left out under ``omit`` is logged as
``contributor_failed``, with ids, the cause's name, the HTTP status and the field path only.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import structlog

from context_assembly.config import ContributorSettings, Settings
from context_assembly.contributors.calls import (
    ContributorTarget,
    contribute_all,
    raise_for_failures,
)
from context_assembly.contributors.client import ContributorClient
from context_assembly.contributors.mcp import McpEndpoints, McpSpec
from context_assembly.contributors.outcomes import ContributorOutcome, PacketFields, Status
from context_assembly.contributors.ssrf import Resolver, UrlPolicy, check_url
from context_assembly.contributors.summarizer import Summarized, summarize
from context_assembly.core.blocks import check_source_blocks
from context_assembly.core.request import Block, ContributorRef, Message, PrepareRequest
from context_assembly.core.sources import (
    SourceFailure,
    SourceInput,
    SourceSetup,
    materialised_inputs,
)
from context_assembly.errors import AssemblyTimeoutError, InvalidError, UrlRejectedError
from context_assembly.preparations.clock import Clock

log = structlog.get_logger("context_assembly.contributors")


def check_blocks(outcome: ContributorOutcome, request: PrepareRequest) -> ContributorOutcome:
    """Apply the per-source block rules (docs/contract.md, "Block rules") to one contributor's answer.

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
        failure = SourceFailure(
            "block_rules",
            f"block rules: {err.detail}",
            field=_block_field(err, outcome.source, outcome.blocks),
        )
        return replace(
            outcome,
            status="invalid",
            blocks=(),
            skipped=(),
            cause=failure.detail,
            failure=failure,
        )
    return outcome


# The rule's ``field`` as a block's member: a dependency's id is one of its ``dependencies``.
_BLOCK_MEMBERS = {"dependency id": "dependencies"}


def _block_field(err: InvalidError, source: str, blocks: Sequence[Block]) -> str | None:
    """Where in the answer a block rule broke: ``blocks.N.member`` for one block (the last
    with its id: a duplicate's second), ``blocks`` for their number, ``None`` otherwise (a
    dependency cycle runs through several blocks)."""
    member = err.extensions.get("field")
    if member == "max_blocks":
        return "blocks"
    qids = err.extensions.get("block_ids") or []
    if len(qids) != 1:
        return None
    index = next(
        (i for i in reversed(range(len(blocks))) if f"{source}/{blocks[i].id}" == qids[0]), None
    )
    if index is None:
        return None
    if not isinstance(member, str):
        return f"blocks.{index}"
    return f"blocks.{index}.{_BLOCK_MEMBERS.get(member, member)}"


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


def mcp_spec(conf: ContributorSettings) -> McpSpec:
    """What a ``kind = "mcp"`` registration reads, with its header values resolved."""
    return McpSpec(
        url=conf.url,
        resources=conf.resources if conf.resources == "listed" else tuple(conf.resources or ()),
        tool=conf.tool,
        tool_arguments=conf.tool_arguments or {},
        headers={name: value.get_secret_value() for name, value in conf.headers.items()},
    )


def inline_mcp_spec(ref: ContributorRef) -> McpSpec:
    """What an inline ``kind: "mcp"`` contributor reads (no headers: a secret is only ever
    named by reference, in the configuration)."""
    assert ref.url is not None
    return McpSpec(
        url=ref.url,
        resources=ref.resources if ref.resources == "listed" else tuple(ref.resources or ()),
        tool=ref.tool,
        tool_arguments=ref.tool_arguments or {},
    )


@dataclass(frozen=True, slots=True)
class Collected:
    """Contributor results of one round, ready for the core."""

    inputs: list[SourceInput]
    outcomes: list[ContributorOutcome]
    used_ms: float

    def answered(self) -> dict[str, bool]:
        """Whether each webhook source called answered (a source refused before its call has an
        outcome that is not ``ok`` too)."""
        return {outcome.source: outcome.ok for outcome in self.outcomes}


class Contributors:
    """The contributor targets of the current configuration, and the calls of one round."""

    def __init__(
        self,
        settings: Settings,
        client: ContributorClient,
        *,
        resolver: Resolver | None,
        clock: Clock,
    ) -> None:
        self.client = client
        self.resolver = resolver
        self.clock = clock
        self.mcp = McpEndpoints()
        self.reconfigure(settings)

    def reconfigure(self, settings: Settings) -> None:
        """Take reloaded settings (registrations, allowlist, limits) for the next calls; the MCP
        sessions of registrations removed or changed are dropped and ended on their servers."""
        self.settings = settings
        self.url_policy = UrlPolicy(
            allow=settings.inline_urls.entries(), allow_private=settings.inline_urls.allow_private
        )
        self.mcp_specs = {
            name: mcp_spec(conf)
            for name, conf in settings.contributors.items()
            if conf.kind == "mcp"
        }
        self.mcp.retain(self.mcp_specs)

    async def aclose(self) -> None:
        """End the MCP sessions on their servers (at shutdown, before the contributor client
        closes)."""
        await self.mcp.aclose()

    def registered(self, tenant: str, index: int, ref: ContributorRef) -> ContributorTarget:
        """The target of the registered endpoint ``ref`` names, as registered now; an endpoint
        this tenant does not have is a 422 naming ``contributors.{index}.endpoint``."""
        conf = self.settings.contributors.get(ref.endpoint or "")
        if conf is None or (conf.tenants is not None and tenant not in conf.tenants):
            raise InvalidError(
                f"contributors.{index}.endpoint: no contributor endpoint named "
                f"{ref.endpoint!r} is registered for this tenant",
                field=f"contributors.{index}.endpoint",
            )
        spec = self.mcp_specs.get(ref.endpoint or "")
        secret = conf.secret.get_secret_value() if conf.secret is not None else None
        return ContributorTarget(
            source=ref.source,
            url=conf.url,
            secret=secret,
            failure_policy=ref.failure_policy or conf.failure_policy,
            kind="registered",
            mcp=self.mcp.registered(tenant, ref.endpoint or "", spec) if spec else None,
        )

    def summarizer(self, tenant: str, endpoint: str) -> ContributorTarget:
        """The webhook target of ``assembly.compaction.summarizer``; an endpoint this tenant
        does not have, or an MCP one, is a 422 naming the field."""
        field = "assembly.compaction.summarizer"
        conf = self.settings.contributors.get(endpoint)
        if conf is None or (conf.tenants is not None and tenant not in conf.tenants):
            raise InvalidError(
                f"{field}: no contributor endpoint named {endpoint!r} is registered for this "
                "tenant",
                field=field,
            )
        if conf.kind != "webhook":
            raise InvalidError(
                f"{field}: {endpoint!r} is an MCP server, not a webhook", field=field
            )
        secret = conf.secret.get_secret_value() if conf.secret is not None else None
        return ContributorTarget(source=endpoint, url=conf.url, secret=secret)

    async def summarize(
        self,
        target: ContributorTarget,
        request: PrepareRequest,
        messages: Sequence[Message],
        preparation_id: str,
        *,
        budget_ms: float,
        attempt: int,
        model: str,
    ) -> Summarized:
        """Call the summarizer ``target`` with ``messages`` within ``budget_ms``."""
        return await summarize(
            self.client,
            target,
            preparation_id=preparation_id,
            model=model,
            messages=messages,
            max_summary_tokens=request.options.compaction.summary_tokens,
            scope=request.scope,
            deadline_monotonic=self.clock.monotonic() + max(budget_ms, 0.0) / 1000.0,
            deadline_unix_ms=int((self.clock.wall() + budget_ms / 1000.0) * 1000),
            attempt=attempt,
            max_response_bytes=self.settings.limits.max_contributor_response_bytes,
            clock=self.clock.monotonic,
        )

    def split(
        self, tenant: str, refs: Sequence[ContributorRef]
    ) -> tuple[list[ContributorTarget], list[ContributorRef]]:
        """The targets of the registered endpoints among ``refs`` (raising as ``registered``)
        and the inline refs, whose URLs are checked when they are called."""
        targets: list[ContributorTarget] = []
        inline: list[ContributorRef] = []
        for index, ref in enumerate(refs):
            if ref.endpoint is not None:
                targets.append(self.registered(tenant, index, ref))
            else:
                inline.append(ref)
        return targets, inline

    async def inline(self, ref: ContributorRef, deadline: float) -> ContributorTarget:
        """The target of an inline URL once it is checked (``UrlRejectedError`` when refused,
        ``AssemblyTimeoutError`` when its lookup is past ``deadline``)."""
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
            mcp=self.mcp.inline(inline_mcp_spec(ref), checked) if ref.kind == "mcp" else None,
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
            target = await self.inline(ref, deadline)
        except (UrlRejectedError, AssemblyTimeoutError) as err:
            if (ref.failure_policy or "fail") == "fail":
                raise
            status: Status = "rejected" if isinstance(err, UrlRejectedError) else "timeout"
            failure = (
                SourceFailure("url_rejected", str(err.extensions.get("reason", "rejected")))
                if status == "rejected"
                else SourceFailure("timeout", "DNS past the deadline")
            )
            elapsed = (self.clock.monotonic() - started) * 1000.0
            return None, ContributorOutcome.failed(ref.source, status, elapsed, failure)
        [outcome] = await call([target])
        return target, replace(outcome, duration_ms=(self.clock.monotonic() - started) * 1000.0)

    async def collect(
        self,
        tenant: str,
        request: PrepareRequest,
        setups: Sequence[SourceSetup],
        preparation_id: str,
        *,
        budget_ms: float,
        attempt: int,
        model: str | None = None,
    ) -> Collected:
        """Run the webhook contributors of ``request`` under one deadline of ``budget_ms``.

        Packets name ``model`` (a refresh: the routed model), else the request's model (with
        ``models``: the preferred candidate, as routing runs after the contributions).
        """
        start = self.clock.monotonic()
        deadline = start + max(budget_ms, 0.0) / 1000.0
        targets, inline = self.split(tenant, request.contributors)
        outcomes: list[ContributorOutcome] = []
        if request.contributors:
            # With no time left (a refresh after a slow prepare), every call settles as
            # ``skipped_deadline`` unsent, and each source's failure policy decides as usual.
            fields = PacketFields(
                preparation_id=preparation_id,
                model=model if model is not None else request.model_name,
                input=request.input,
                data_budget_tokens=request.options.max_data_tokens,
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
                check=functools.partial(check_blocks, request=request),
                fail_fast=True,
            )
            registered = call(targets)
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
        # An inline MCP URL refused before its call has no target, but its ref says the kind.
        mcp_sources = {t.source for t in targets if t.mcp is not None} | {
            ref.source for ref in inline if ref.kind == "mcp"
        }
        inputs: list[SourceInput] = []
        materialised = {i.setup.source: i for i in materialised_inputs(request, setups)}
        for setup in setups:
            if setup.kind == "webhook":
                outcome = by_source[setup.source]
                inputs.append(
                    SourceInput(
                        replace(setup, kind="mcp") if setup.source in mcp_sources else setup,
                        outcome.status,
                        outcome.duration_ms,
                        outcome.revision,
                        outcome.blocks,
                        tuple((item.id, item.reason) for item in outcome.skipped),
                        None if outcome.ok else outcome.failure,
                    )
                )
                if not outcome.ok:
                    _log_failed(preparation_id, inputs[-1])
            else:
                inputs.append(materialised[setup.source])
        return Collected(inputs, outcomes, used_ms)


def _log_failed(preparation_id: str, item: SourceInput) -> None:
    """The ``contributor_failed`` line of a source left out under ``omit``: ids, its status, the
    cause's name, the HTTP status and the field path, never the cause's words (which may name a
    block id) nor anything of an answer."""
    failure = item.failure
    log.warning(
        "contributor_failed",
        preparation_id=preparation_id,
        source=item.setup.source,
        kind=item.setup.kind,
        status=item.status,
        duration_ms=round(item.duration_ms, 3),
        cause=failure.cause if failure is not None else None,
        **({"http_status": failure.status} if failure and failure.status is not None else {}),
        **({"field": failure.field} if failure and failure.field is not None else {}),
    )
