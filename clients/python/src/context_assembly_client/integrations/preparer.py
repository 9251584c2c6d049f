"""The loop every runtime adapter runs around one model call, in one place.

A runtime adapter (LangChain, Pydantic AI, the OpenAI Agents SDK) only maps between its runtime's
types and the service's neutral shape; everything else happens here, in :class:`Preparer` (and
:class:`PreparerAdapter`, what every adapter shares around it), with the modules it draws on:

1. **The request.** The runtime's call, as neutral messages and tools (:class:`RuntimeCall`),
   becomes a prepare request: the system prompt is ``instructions``, the tool definitions are
   ``tools``, and the messages are split into ``history`` and ``input`` by :func:`split_turn`
   (:mod:`.frames`). The rest of the request (budgets, plugins, registered contributors,
   ``assembly``, ``cache``, ``scope``) is the application's ``template``; inline blocks come from
   its ``contributions`` callable, after the template's own. ``render`` is always
   ``"neutral"``. ``model`` is the model the runtime is about to call (:attr:`RuntimeCall.model`,
   the runtime's name for it) unless the template names one (or ``models``);
   ``assembly.layout`` is ``"transcript"`` unless the template names one; ``scope`` is
   ``{"task_id": <the runtime's conversation id>}`` when the template has none and the runtime
   offers one (:attr:`RuntimeCall.conversation`).
2. **Prepare** with the public client API (:meth:`Client.prepare` / :meth:`AsyncClient.prepare`)
   under the adapter's deadline (``timeout`` seconds: the whole call on the async path, each phase
   of it on the sync path, where nothing can interrupt a blocking read).
3. **The frame, aligned** (:func:`align`, :mod:`.frames`): the frame's messages matched with the
   runtime's own objects, the messages the service added marked as such. Tools come back as the
   runtime's tool objects in frame order; the cache plan of ``selection.cache`` as
   :class:`Breakpoint` values and the OpenAI ``prompt_cache_key`` / ``prompt_cache_retention``,
   and the output limit the budget reserved (at most the model's maximum output of
   ``GET /v1/models``) as :attr:`Prepared.output_limit` (:mod:`.call_settings`).
4. **Compaction** (docs/integrations.md#compaction). Every answer's ``selection.compaction`` is
   :attr:`Preparer.last_compaction` and goes to ``on_compaction`` when it decided to act.
   ``assembly.compaction.mode: "native"`` needs a provider render, which an adapter cannot ask
   for: the adapter asks the service to decide as in ``report`` and writes the provider's own
   directive (:func:`native_directive`, :mod:`.call_settings`) into the call for a model class
   that carries it (:attr:`RuntimeCall.native_compaction`); for any other class it warns once and
   counts ``stats.native_compaction_skipped``. The history the service leaves out (before a
   provider's compaction item, folded into a summary) and the tool results it clears are matched
   by :func:`align` like dropped history and rewritten messages.
5. **Usage** (:meth:`Preparer.report_usage`) goes to the service in the background, from a
   bounded queue (:mod:`.usage_reports`; a full queue's dropped reports are counted in
   ``stats.usage_reports_dropped``): it never delays or fails the agent's answer and never keeps
   the process alive. :meth:`Preparer.flush` waits for the queue; :meth:`Preparer.close` waits at
   most ``CLOSE_WAIT`` seconds, and the interpreter's exit at most ``EXIT_WAIT`` seconds. A failed
   report is logged and counted (``stats.usage_report_failures``).
6. **Fail open.** The service unreachable, slower than the deadline or answering 5xx, an answer
   that does not fit what was sent, or a failure of the mapping itself: one warning is logged and
   the adapter lets the runtime's original request go through (``stats.failed_open``), unless
   ``fail_open=False``, which raises instead. A failure of the mapping (an exception of the
   adapter's own code, or a frame that does not match what was sent) is also counted in
   ``stats.mapping_errors`` and its warning names where it happened (module, line and function
   of each frame of the traceback). A 4xx answer always raises: the template or the
   contributions are wrong, which is the application's to fix. Errors raised by the application's
   own ``contributions`` callable are never caught.

Logs carry ids, counts, statuses, error classes and code locations, never texts.

The names the adapters use from :mod:`.frames`, :mod:`.call_settings`, :mod:`.outcomes` and
:mod:`.usage_reports` are importable from here too.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, TypeAlias, TypeVar

import anyio

from context_assembly_client import APIStatusError, AsyncClient, Client, ContextAssemblyError
from context_assembly_client.integrations.call_settings import (
    Breakpoint,
    ModelMaxima,
    NativeApi,
    cache_control,
    cache_plan,
    native_directive,
    with_native,
)
from context_assembly_client.integrations.frames import (
    Carried,
    FrameMessage,
    IntegrationError,
    Prepared,
    RuntimeCall,
    align,
    history_skipped,
    is_compaction_item,
    split_turn,
    text_of,
)
from context_assembly_client.integrations.outcomes import (
    AdapterStats,
    is_mapping_bug,
    status_note,
    where,
)
from context_assembly_client.integrations.usage_reports import (
    CLOSE_WAIT,
    EXIT_WAIT,
    REPORT_QUEUE,
    REPORT_TIMEOUT,
    ReportQueue,
    UsageReport,
    normalized_usage,
    send_report,
)
from context_assembly_client.types import (
    CompactionReport,
    ModelList,
    NativeDirective,
    PrepareResponse,
    Provider,
)

__all__ = [
    "CLOSE_WAIT",
    "DEFAULT_DEADLINE",
    "EXIT_WAIT",
    "REPORT_QUEUE",
    "REPORT_TIMEOUT",
    "AdapterStats",
    "Breakpoint",
    "Carried",
    "ContributionList",
    "Contributions",
    "FrameMessage",
    "IntegrationError",
    "NativeApi",
    "Prepared",
    "Preparer",
    "PreparerAdapter",
    "RuntimeCall",
    "align",
    "cache_control",
    "history_skipped",
    "is_compaction_item",
    "native_directive",
    "normalized_usage",
    "split_turn",
    "text_of",
    "with_native",
]

logger = logging.getLogger("context_assembly_client.integrations")

DEFAULT_DEADLINE: Final = 2.0
"""Seconds an adapter waits for a prepare before the model call goes on without it. The service's
own contributor deadline (``assembly.timeout_ms``) defaults to one second; the rest is selection,
storage and the network."""

DEFAULT_LAYOUT: Final = "transcript"
"""The layout an adapter asks for when the template's ``assembly`` names none."""

RESERVED_KEYS: Final = frozenset({"instructions", "history", "input", "tools"})
"""Request fields the adapter fills from the runtime's call; a template must not set them."""


ContributionList: TypeAlias = Sequence[Mapping[str, Any]]
Contributions: TypeAlias = Callable[[Any], ContributionList | Awaitable[ContributionList]]
"""The application's inline sources: called with the runtime's state, returns (or, async,
resolves to) ``[{source, revision, blocks: [{id, text, ...}]}]``."""

T = TypeVar("T")

_cache_plan = cache_plan
""":func:`~.call_settings.cache_plan` under the name it had here (the tests import it)."""


# --------------------------------------------------------------------------- the loop


class Preparer:
    """Prepares a runtime's model calls through the service and reports their usage.

    Args:
        client_or_base_url: the service's base URL, or a :class:`Client` / :class:`AsyncClient`.
            The adapter needs both twins (a sync agent prepares with a ``Client``, an async one
            with an ``AsyncClient``); the one not given is made from the given one's ``base_url``
            and ``api_key``. Usage reports go out with a client of their own (short timeout, no
            retry), which sends through a given ``Client``'s HTTP client.
        template: the prepare request without the runtime's parts (see the module doc).
        contributions: the application's inline sources, sync or async, called with the
            runtime's state.
        fail_open: let the original call through when the service fails (``False``: raise).
        timeout: the deadline of one prepare, in seconds.
        api_key: the service's API key, when ``client_or_base_url`` is a URL.
        on_prepared: called with each prepare answer (ids, manifest, budget) before the model
            call goes out, e.g. to log the preparation id or link its breakdown page.
        on_compaction: called with the compaction decision (:attr:`Prepared.compaction`) before
            the model call goes out, when it is not ``none``.

    Raises:
        ValueError: for a template that sets a field the adapter fills, or another ``render``.
    """

    def __init__(
        self,
        client_or_base_url: str | Client | AsyncClient,
        *,
        template: Mapping[str, Any],
        contributions: Contributions | None = None,
        fail_open: bool = True,
        timeout: float = DEFAULT_DEADLINE,
        api_key: str | None = None,
        on_prepared: Callable[[PrepareResponse], None] | None = None,
        on_compaction: Callable[[CompactionReport], None] | None = None,
    ) -> None:
        reserved = sorted(RESERVED_KEYS.intersection(template))
        if reserved:
            raise ValueError(
                f"the template must not set {', '.join(reserved)}: the adapter fills it from the runtime's call"
            )
        if template.get("render", "neutral") != "neutral":
            raise ValueError(
                'an adapter prepares with render "neutral"; leave "render" out of the template'
            )
        assembly = dict(template.get("assembly") or {})
        assembly.setdefault("layout", DEFAULT_LAYOUT)
        compaction = assembly.get("compaction")
        self.native = False
        if isinstance(compaction, Mapping) and compaction.get("mode") == "native":
            # A neutral frame has no provider body for the directive (the service refuses
            # "native" without a provider render): the service decides as in "report" and the
            # adapter writes the directive where the model's class takes it.
            self.native = True
            assembly["compaction"] = {**compaction, "mode": "report"}
        self.template: dict[str, Any] = {**template, "render": "neutral", "assembly": assembly}
        self.contributions = contributions
        self.fail_open = fail_open
        self.timeout = timeout
        self.on_prepared = on_prepared
        self.on_compaction = on_compaction
        self.stats = AdapterStats()
        self.last_compaction: CompactionReport | None = None
        """The compaction decision of the latest prepared call (:attr:`Prepared.compaction`)."""
        self._warned_native = False
        self._client: Client | None = None
        self._aclient: AsyncClient | None = None
        self._reporter: Client | None = None
        self._owned: list[Client | AsyncClient] = []
        if isinstance(client_or_base_url, Client):
            self._client = client_or_base_url
        elif isinstance(client_or_base_url, AsyncClient):
            self._aclient = client_or_base_url
        given = self._client or self._aclient
        self._base_url = given.base_url if given is not None else str(client_or_base_url)
        self._api_key = given.api_key if given is not None else api_key
        self._lock = threading.Lock()
        self._maxima = ModelMaxima()
        self._reports = ReportQueue(
            lambda report: send_report(self._report_client, report, self.stats),
            lambda count: self.stats.add("usage_reports_dropped", count),
            REPORT_QUEUE,
        )

    # ------------------------------------------------------------------ clients

    def client(self) -> Client:
        """The sync client (made on first use when only a URL or an ``AsyncClient`` was given)."""
        with self._lock:
            if self._client is None:
                self._client = Client(self._base_url, api_key=self._api_key)
                self._owned.append(self._client)
            return self._client

    def aclient(self) -> AsyncClient:
        """The async client (made on first use when only a URL or a ``Client`` was given)."""
        with self._lock:
            if self._aclient is None:
                self._aclient = AsyncClient(self._base_url, api_key=self._api_key)
                self._owned.append(self._aclient)
            return self._aclient

    def _report_client(self) -> Client:
        """The usage reports' client: ``REPORT_TIMEOUT`` per phase, no retry."""
        with self._lock:
            if self._reporter is None:
                given = self._client if self._client not in self._owned else None
                self._reporter = Client(
                    self._base_url,
                    api_key=self._api_key,
                    timeout=REPORT_TIMEOUT,
                    max_retries=0,
                    http_client=given._client if given is not None else None,
                )
            return self._reporter

    # ------------------------------------------------------------------ prepare

    def run(
        self, build: Callable[[], RuntimeCall], state: Any, apply: Callable[[Prepared], T]
    ) -> tuple[T, Prepared] | None:
        """Prepare a call on the sync path: the runtime's request rebuilt by ``apply`` from the
        frame, with the preparation; ``None`` when the call must go on unchanged (fail open)."""
        contributed = self._contributed_sync(state)
        try:
            call = build()
            history, inputs = split_turn(call.messages)
            body = self._body(call, history, inputs, contributed)
            response = self.client().prepare(body, timeout=self.timeout)
            limit = self._maxima.limit(response, lambda: self.client().models(timeout=self.timeout))
            outcome = self._finish(call, history, inputs, response, apply, limit)
        except Exception as err:
            self._failed(err)
            return None
        self._announce(response, outcome[1])
        return outcome

    async def arun(
        self, build: Callable[[], RuntimeCall], state: Any, apply: Callable[[Prepared], T]
    ) -> tuple[T, Prepared] | None:
        """:meth:`run` on the async path; the deadline bounds the whole prepare."""
        contributed = await self._contributed_async(state)
        try:
            call = build()
            history, inputs = split_turn(call.messages)
            body = self._body(call, history, inputs, contributed)
            with anyio.fail_after(self.timeout):
                response = await self.aclient().prepare(body, timeout=self.timeout)
            registry = await self._registry(response)
            limit = self._maxima.limit(response, lambda: registry)
            outcome = self._finish(call, history, inputs, response, apply, limit)
        except Exception as err:
            self._failed(err)
            return None
        self._announce(response, outcome[1])
        return outcome

    def _announce(self, response: PrepareResponse, prepared: Prepared) -> None:
        if self.on_prepared is not None:
            self.on_prepared(response)
        decided = prepared.compaction
        if self.on_compaction is not None and decided is not None and decided.decision != "none":
            self.on_compaction(decided)

    def _contributed_sync(self, state: Any) -> list[Mapping[str, Any]]:
        if self.contributions is None:
            return []
        result = self.contributions(state)
        if inspect.isawaitable(result):  # an async callable on a sync agent: run it to the end
            result = asyncio.run(_resolved(result))
        return list(result)

    async def _contributed_async(self, state: Any) -> list[Mapping[str, Any]]:
        if self.contributions is None:
            return []
        result = self.contributions(state)
        if inspect.isawaitable(result):
            result = await result
        return list(result)

    def _body(
        self,
        call: RuntimeCall,
        history: Sequence[Carried],
        inputs: Sequence[Carried],
        contributed: Sequence[Mapping[str, Any]],
    ) -> dict[str, Any]:
        body = dict(self.template)
        if "model" not in body and "models" not in body:
            body["model"] = call.model or "unknown"
        if "scope" not in body and call.conversation:
            body["scope"] = {"task_id": call.conversation}
        body["instructions"] = call.instructions
        body["tools"] = [tool.neutral for tool in call.tools]
        body["history"] = [message.neutral for message in history]
        body["input"] = [message.neutral for message in inputs]
        if contributed:
            body["contributions"] = [*self.template.get("contributions", ()), *contributed]
        return body

    # ------------------------------------------------------------------ output limit

    async def _registry(self, response: PrepareResponse) -> ModelList | None:
        """``GET /v1/models`` on the async path, when the model's maximum output is still unknown
        (once per adapter; ``None`` when it is not needed or cannot be read in time)."""
        if not self._maxima.needed(response):
            return None
        with anyio.move_on_after(self.timeout):
            try:
                return await self.aclient().models(timeout=self.timeout)
            except ContextAssemblyError as err:
                logger.debug("the model registry could not be read (%s)", type(err).__name__)
        return None

    def _finish(
        self,
        call: RuntimeCall,
        history: Sequence[Carried],
        inputs: Sequence[Carried],
        response: PrepareResponse,
        apply: Callable[[Prepared], T],
        limit: int | None = None,
    ) -> tuple[T, Prepared]:
        frame = response.frame
        messages = align(frame.get("messages", []), history, inputs, history_skipped(response))
        by_name = {tool.neutral["name"]: tool.origin for tool in call.tools}
        try:
            tools = [by_name[tool["name"]] for tool in frame.get("tools", [])]
        except KeyError:
            raise IntegrationError("the frame names a tool that was not sent") from None
        breakpoints, key, retention = cache_plan(response)
        compaction, native = self._native(call, response.selection.compaction)
        prepared = Prepared(
            response, messages, tools, breakpoints, key, retention, limit, compaction, native
        )
        result = apply(prepared)
        self.last_compaction = compaction
        self.stats.add("prepared")
        logger.debug(
            "prepared %s: %d messages, %d tools, %d input tokens",
            prepared.preparation_id,
            len(messages),
            len(tools),
            response.budget.total_input_tokens,
        )
        return result, prepared

    def _native(
        self, call: RuntimeCall, report: CompactionReport | None
    ) -> tuple[CompactionReport | None, NativeDirective | None]:
        """The decision as presented, and the directive to write (``mode: "native"`` only)."""
        if not self.native or report is None:
            return report, None
        if call.native_compaction is None:
            self.stats.add("native_compaction_skipped")
            if not self._warned_native:
                self._warned_native = True
                logger.warning(
                    "context-assembly: compaction mode 'native' has no place in a call to this "
                    "model's class; its calls go out without the provider's compaction"
                )
            return report.model_copy(update={"mode": "native"}), None
        directive = native_directive(report, call.native_compaction)
        return report.model_copy(update={"mode": "native", "native": directive}), directive

    def _failed(self, err: Exception) -> None:
        """Raise ``err`` when the call must not go on unchanged; else warn once and count."""
        if isinstance(err, APIStatusError) and err.status_code < 500:
            raise err
        if not self.fail_open:
            raise err
        self.stats.add("failed_open")
        if is_mapping_bug(err):
            self.stats.add("mapping_errors")
            logger.warning(
                "context-assembly: the model call goes on unchanged (mapping failed: %s at %s)",
                type(err).__name__,
                where(err),
            )
            return
        logger.warning(
            "context-assembly: the model call goes on unchanged (prepare failed: %s%s)",
            type(err).__name__,
            status_note(err),
        )

    # ------------------------------------------------------------------ usage

    def reporting(self, report: Callable[[], None]) -> None:
        """Run an adapter's usage mapping (``report``, which calls :meth:`report_usage`): a failure
        of it is a mapping bug, logged with where it happened and counted, never raised."""
        try:
            report()
        except Exception as err:
            self.stats.add("mapping_errors")
            logger.warning(
                "context-assembly: the usage of a call was not reported (mapping failed: %s at %s)",
                type(err).__name__,
                where(err),
            )

    def report_usage(
        self,
        prepared: Prepared,
        *,
        provider: Provider,
        usage: Mapping[str, Any],
        report_id: str | None = None,
        response_id: str | None = None,
        diagnostics: Mapping[str, Any] | None = None,
    ) -> None:
        """Queue a usage report for the background thread; never raises, never blocks."""
        report = UsageReport(
            prepared.preparation_id,
            report_id or response_id or f"adapter-{uuid.uuid4().hex}",
            provider,
            dict(usage),
            response_id or None,
            dict(diagnostics) if diagnostics else None,
        )
        self._reports.put(report)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the queued usage reports are sent (or failed); ``False`` on timeout."""
        return self._reports.wait(timeout)

    # ------------------------------------------------------------------ lifecycle

    def close(self, timeout: float = CLOSE_WAIT) -> bool:
        """Wait at most ``timeout`` seconds for the queued reports, drop the rest (counted in
        ``stats.usage_reports_dropped``), stop the thread and close the sync clients the adapter
        made; ``False`` when reports were dropped."""
        done = self._reports.close(timeout)
        with self._lock:
            reporter, self._reporter = self._reporter, None
        if reporter is not None:
            reporter.close()
        for owned in self._owned:
            if isinstance(owned, Client):
                owned.close()
        return done

    async def aclose(self, timeout: float = CLOSE_WAIT) -> bool:
        """:meth:`close` for async code: the queue is waited for off the event loop."""
        done: bool = await anyio.to_thread.run_sync(self.close, timeout)
        for owned in self._owned:
            if isinstance(owned, AsyncClient):
                await owned.aclose()
        return done


async def _resolved(awaitable: Awaitable[T]) -> T:
    return await awaitable


class PreparerAdapter:
    """What every runtime adapter shares around its :class:`Preparer`: the constructor (the same
    arguments everywhere), the counters, and waiting for and closing the usage reports. A
    runtime's own base class comes after it (``class X(PreparerAdapter, AgentMiddleware)``) and
    is initialised without arguments."""

    def __init__(
        self,
        client_or_base_url: str | Client | AsyncClient,
        *,
        template: Mapping[str, Any],
        contributions: Contributions | None = None,
        fail_open: bool = True,
        timeout: float = DEFAULT_DEADLINE,
        api_key: str | None = None,
        on_prepared: Callable[[PrepareResponse], None] | None = None,
        on_compaction: Callable[[CompactionReport], None] | None = None,
    ) -> None:
        super().__init__()
        self.preparer = Preparer(
            client_or_base_url,
            template=template,
            contributions=contributions,
            fail_open=fail_open,
            timeout=timeout,
            api_key=api_key,
            on_prepared=on_prepared,
            on_compaction=on_compaction,
        )

    @property
    def stats(self) -> AdapterStats:
        """Counters: calls prepared, calls that failed open, usage reports and their failures."""
        return self.preparer.stats

    @property
    def last_compaction(self) -> CompactionReport | None:
        """The compaction decision of the latest call this adapter prepared (``None`` before the
        first): ``selection.compaction``, with ``mode: "native"`` and the directive the adapter
        wrote when the template asked for it. An adapter shared by concurrent conversations
        holds whichever prepared last: read it per conversation from ``on_compaction`` or the
        runtime's own place (docs/integrations.md#compaction)."""
        return self.preparer.last_compaction

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for the queued usage reports; ``False`` if some are still going at ``timeout``."""
        return self.preparer.flush(timeout)

    def close(self, timeout: float = CLOSE_WAIT) -> bool:
        """Send the queued reports (waiting at most ``timeout`` seconds, then dropping the rest)
        and close the clients the adapter made; ``False`` when reports were dropped."""
        return self.preparer.close(timeout)

    async def aclose(self, timeout: float = CLOSE_WAIT) -> bool:
        """:meth:`close` from async code."""
        return await self.preparer.aclose(timeout)
