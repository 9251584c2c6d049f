"""The loop every runtime adapter runs around one model call, in one place.

A runtime adapter (LangChain, Pydantic AI, the OpenAI Agents SDK) only maps between its runtime's
types and the service's neutral shape; everything else happens here:

1. **The request.** The runtime's call, as neutral messages and tools (:class:`RuntimeCall`),
   becomes a prepare request: the system prompt is ``instructions``, the tool definitions are
   ``tools``, and the messages are split into ``history`` and ``input`` by :func:`split_turn`:
   ``input`` is the latest user turn (the run of consecutive user messages that holds the last
   one) and every message after it, tool calls and their results included; ``history`` is
   everything before it. The split never falls between a tool call and its results, because the
   service puts its own messages (the per-turn developer message, the data message) between
   history and input, and providers refuse anything between an assistant's tool calls and their
   results. A call without any user message is all ``input``. The rest of the
   request (model, budgets, plugins, registered contributors, ``assembly``, ``cache``, ``scope``)
   is the application's ``template``; inline blocks come from its ``contributions`` callable,
   after the template's own. ``render`` is always ``"neutral"``.
2. **Prepare** with the public client API (:meth:`Client.prepare` / :meth:`AsyncClient.prepare`)
   under the adapter's deadline (``timeout`` seconds: the whole call on the async path, each phase
   of it on the sync path, where nothing can interrupt a blocking read).
3. **The frame, aligned** (:func:`align`): each frame message is matched, in order, with the
   neutral message the adapter sent, so that the runtime gets its own objects back (images,
   files, reasoning blocks, ids and metadata included); the messages the service added (leading
   system message, per-turn developer message, data message) are marked as such for the adapter
   to build in its runtime's types. The history the service dropped under ``history_policy:
   drop_oldest`` is the only thing missing, as ``budget.history_dropped_messages`` says. Tools come
   back as the runtime's tool objects in frame order, and the cache plan of ``selection.cache`` as
   :class:`Breakpoint` values and the OpenAI ``prompt_cache_key`` / ``prompt_cache_retention``.
4. **Usage** (:meth:`Preparer.report_usage`) goes to the service from one background thread with
   the sync client: it never delays or fails the agent's answer, outlives the event loop of an
   ``asyncio.run``, and a failed report is logged and counted
   (``stats.usage_report_failures``). :meth:`Preparer.flush` waits for the reports under way.
5. **Fail open.** The service unreachable, slower than the deadline or answering 5xx, an answer
   that does not fit what was sent, or a failure of the mapping itself: one warning is logged and
   the adapter lets the runtime's original request go through (``stats.failed_open``), unless
   ``fail_open=False``, which raises instead. A 4xx answer always raises: the template or the
   contributions are wrong, which is the application's to fix. Errors raised by the application's
   own ``contributions`` callable are never caught.

Logs carry ids, counts, statuses and error classes, never texts.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias, TypeVar

import anyio

from context_assembly_client import APIStatusError, AsyncClient, Client, ContextAssemblyError
from context_assembly_client.types import PrepareResponse, Provider

__all__ = [
    "DEFAULT_DEADLINE",
    "AdapterStats",
    "Breakpoint",
    "Carried",
    "ContributionList",
    "Contributions",
    "FrameMessage",
    "IntegrationError",
    "Prepared",
    "Preparer",
    "PreparerAdapter",
    "RuntimeCall",
    "align",
    "cache_control",
    "normalized_usage",
    "split_turn",
    "text_of",
]

logger = logging.getLogger("context_assembly_client.integrations")

DEFAULT_DEADLINE: Final = 2.0
"""Seconds an adapter waits for a prepare before the model call goes on without it. The service's
own contributor deadline (``assembly.timeout_ms``) defaults to one second; the rest is selection,
storage and the network."""

RESERVED_KEYS: Final = frozenset({"instructions", "history", "input", "tools"})
"""Request fields the adapter fills from the runtime's call; a template must not set them."""

ADDED_ROLES: Final = frozenset({"system", "developer", "user"})
"""Roles of the messages the service adds to a frame (leading system, per-turn developer, data)."""

ContributionList: TypeAlias = Sequence[Mapping[str, Any]]
Contributions: TypeAlias = Callable[[Any], ContributionList | Awaitable[ContributionList]]
"""The application's inline sources: called with the runtime's state, returns (or, async,
resolves to) ``[{source, revision, blocks: [{id, text, ...}]}]``."""

T = TypeVar("T")


class IntegrationError(ContextAssemblyError):
    """The adapter could not map a call or a frame: a message it has no neutral form for, or a
    frame that does not match what was sent. The call fails open like a service failure."""


# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class Carried:
    """One neutral message or tool and the runtime object(s) it stands for (``origin``)."""

    neutral: dict[str, Any]
    origin: Any


@dataclass(frozen=True, slots=True)
class RuntimeCall:
    """A runtime's model call in the service's neutral shape."""

    instructions: str
    messages: Sequence[Carried]
    tools: Sequence[Carried] = ()


@dataclass(frozen=True, slots=True)
class FrameMessage:
    """One frame message: its ``index`` in the frame, and the runtime object it came from
    (``origin``), or ``None`` for a message the service added (``neutral`` then says what)."""

    index: int
    neutral: dict[str, Any]
    origin: Any | None


@dataclass(frozen=True, slots=True)
class Breakpoint:
    """An Anthropic cache marker of the plan: after the last tool (``message`` is ``None``) or at
    the end of the frame message ``message``."""

    after: Literal["tools", "instructions", "history", "end"]
    ttl: Literal["5m", "1h"]
    message: int | None


@dataclass(frozen=True, slots=True)
class Prepared:
    """A prepared call: the service's answer and the frame in terms of the runtime's objects."""

    response: PrepareResponse
    messages: Sequence[FrameMessage]
    tools: Sequence[Any]
    breakpoints: Sequence[Breakpoint] = ()
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None

    @property
    def preparation_id(self) -> str:
        return self.response.preparation_id


@dataclass
class AdapterStats:
    """What an adapter did, counted since it was made (read them; the adapter writes them)."""

    prepared: int = 0
    """Model calls that went out with a frame."""
    failed_open: int = 0
    """Model calls that went out unchanged because the preparation failed."""
    usage_reports: int = 0
    """Usage reports the service accepted."""
    usage_report_failures: int = 0
    """Usage reports that failed (logged, never raised)."""
    cache_markers_skipped: int = 0
    """Anthropic markers of a plan that the runtime's types had no place for."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str, count: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + count)


# --------------------------------------------------------------------------- pure steps


def split_turn(messages: Sequence[Carried]) -> tuple[list[Carried], list[Carried]]:
    """``(history, input)``: ``input`` starts the latest user turn (see the module doc)."""
    roles = [message.neutral.get("role") for message in messages]
    if "user" not in roles:
        return [], list(messages)
    start = len(roles) - 1 - roles[::-1].index("user")
    while start > 0 and roles[start - 1] == "user":
        start -= 1
    return list(messages[:start]), list(messages[start:])


def _comparable(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message without its unset fields, as the service echoes it."""
    return {key: value for key, value in message.items() if value is not None}


def align(
    frame_messages: Sequence[Mapping[str, Any]],
    history: Sequence[Carried],
    inputs: Sequence[Carried],
    dropped: int,
) -> list[FrameMessage]:
    """The frame's messages, each with the runtime object it came from (``None``: added).

    The service keeps history (less its ``dropped`` oldest messages) and input in order and only
    adds system, developer and user messages around them, so one pass in order matches them.

    Raises:
        IntegrationError: when the frame holds another message, or lacks one that was sent.
    """
    expected = [*history[dropped:], *inputs]
    aligned: list[FrameMessage] = []
    cursor = 0
    for index, raw in enumerate(frame_messages):
        message = dict(raw)
        if cursor < len(expected) and _comparable(message) == _comparable(expected[cursor].neutral):
            aligned.append(FrameMessage(index, message, expected[cursor].origin))
            cursor += 1
        elif message.get("role") in ADDED_ROLES and isinstance(message.get("content"), str):
            aligned.append(FrameMessage(index, message, None))
        else:
            raise IntegrationError(
                f"frame message {index} ({message.get('role')}) matches no message that was sent"
            )
    if cursor != len(expected):
        raise IntegrationError(
            f"the frame lacks {len(expected) - cursor} message(s) that were sent"
        )
    return aligned


def text_of(content: Any) -> str:
    """The text of a neutral content (a string, or the text parts of a list)."""
    if isinstance(content, str):
        return content
    return "".join(
        part.get("text", "")
        for part in content
        if isinstance(part, Mapping) and part.get("type") == "text"
    )


def cache_control(ttl: str) -> dict[str, str]:
    """Anthropic's ``cache_control`` value for a marker of ``ttl``."""
    return {"type": "ephemeral", "ttl": "1h"} if ttl == "1h" else {"type": "ephemeral"}


def normalized_usage(
    *,
    input_tokens: int | None,
    output_tokens: int | None,
    cached_input_tokens: int | None = None,
    cache_creation_input_tokens: int | None = None,
) -> dict[str, int]:
    """A ``provider="normalized"`` usage object; fields the runtime did not report are left out.

    ``input_tokens`` is every input token the provider processed, cached ones included.
    """
    usage = {
        "provider_input_tokens": input_tokens,
        "cached_input_tokens": cached_input_tokens,
        "cache_creation_input_tokens": cache_creation_input_tokens,
        "output_tokens": output_tokens,
    }
    return {key: value for key, value in usage.items() if isinstance(value, int)}


def _cache_plan(
    response: PrepareResponse,
) -> tuple[list[Breakpoint], str | None, str | None]:
    cache = response.selection.cache
    if cache is None:
        return [], None, None
    breakpoints = [
        Breakpoint(point.after, point.ttl, getattr(point, "message", None))
        for point in cache.breakpoints
    ]
    key = getattr(cache, "prompt_cache_key", None)
    retention = getattr(cache, "prompt_cache_retention", None)
    return breakpoints, key, retention


# --------------------------------------------------------------------------- the loop


class Preparer:
    """Prepares a runtime's model calls through the service and reports their usage.

    Args:
        client_or_base_url: the service's base URL, or a :class:`Client` / :class:`AsyncClient`.
            The adapter needs both twins (a sync agent prepares with a ``Client``, an async one
            with an ``AsyncClient``, and usage reports go out with a ``Client``); the one not given
            is made from the given one's ``base_url`` and ``api_key``.
        template: the prepare request without the runtime's parts (see the module doc).
        contributions: the application's inline sources, sync or async, called with the
            runtime's state.
        fail_open: let the original call through when the service fails (``False``: raise).
        timeout: the deadline of one prepare, in seconds.
        api_key: the service's API key, when ``client_or_base_url`` is a URL.
        on_prepared: called with each prepare answer (ids, manifest, budget) before the model
            call goes out, e.g. to log the preparation id or link its breakdown page.

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
        self.template: dict[str, Any] = {**template, "render": "neutral"}
        self.contributions = contributions
        self.fail_open = fail_open
        self.timeout = timeout
        self.on_prepared = on_prepared
        self.stats = AdapterStats()
        self._client: Client | None = None
        self._aclient: AsyncClient | None = None
        self._owned: list[Client | AsyncClient] = []
        if isinstance(client_or_base_url, Client):
            self._client = client_or_base_url
        elif isinstance(client_or_base_url, AsyncClient):
            self._aclient = client_or_base_url
        given = self._client or self._aclient
        self._base_url = given.base_url if given is not None else str(client_or_base_url)
        self._api_key = given.api_key if given is not None else api_key
        self._lock = threading.Lock()
        self._reports: set[Future[None]] = set()
        self._executor: ThreadPoolExecutor | None = None

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
            outcome = self._finish(call, history, inputs, response, apply)
        except Exception as err:
            self._failed(err)
            return None
        if self.on_prepared is not None:
            self.on_prepared(response)
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
            outcome = self._finish(call, history, inputs, response, apply)
        except Exception as err:
            self._failed(err)
            return None
        if self.on_prepared is not None:
            self.on_prepared(response)
        return outcome

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
        body["instructions"] = call.instructions
        body["tools"] = [tool.neutral for tool in call.tools]
        body["history"] = [message.neutral for message in history]
        body["input"] = [message.neutral for message in inputs]
        if contributed:
            body["contributions"] = [*self.template.get("contributions", ()), *contributed]
        return body

    def _finish(
        self,
        call: RuntimeCall,
        history: Sequence[Carried],
        inputs: Sequence[Carried],
        response: PrepareResponse,
        apply: Callable[[Prepared], T],
    ) -> tuple[T, Prepared]:
        frame = response.frame
        messages = align(
            frame.get("messages", []), history, inputs, response.budget.history_dropped_messages
        )
        by_name = {tool.neutral["name"]: tool.origin for tool in call.tools}
        try:
            tools = [by_name[tool["name"]] for tool in frame.get("tools", [])]
        except KeyError as err:
            raise IntegrationError(f"the frame names a tool that was not sent: {err}") from None
        breakpoints, key, retention = _cache_plan(response)
        prepared = Prepared(response, messages, tools, breakpoints, key, retention)
        result = apply(prepared)
        self.stats.add("prepared")
        logger.debug(
            "prepared %s: %d messages, %d tools, %d input tokens",
            prepared.preparation_id,
            len(messages),
            len(tools),
            response.budget.total_input_tokens,
        )
        return result, prepared

    def _failed(self, err: Exception) -> None:
        """Raise ``err`` when the call must not go on unchanged; else warn once and count."""
        if isinstance(err, APIStatusError) and err.status_code < 500:
            raise err
        if not self.fail_open:
            raise err
        self.stats.add("failed_open")
        logger.warning(
            "context-assembly: the model call goes on unchanged (prepare failed: %s%s)",
            type(err).__name__,
            _status_note(err),
        )

    # ------------------------------------------------------------------ usage

    def report_usage(
        self,
        prepared: Prepared,
        *,
        provider: Provider,
        usage: Mapping[str, Any],
        report_id: str | None = None,
    ) -> None:
        """Send a usage report in the background (one worker thread); never raises."""
        report = report_id or f"adapter-{uuid.uuid4().hex}"
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="context-assembly-usage"
                )
            future = self._executor.submit(
                self._send_report, prepared.preparation_id, report, provider, dict(usage)
            )
            self._reports.add(future)
        future.add_done_callback(self._forget)

    def _forget(self, future: Future[None]) -> None:
        with self._lock:
            self._reports.discard(future)

    def _send_report(
        self, preparation_id: str, report_id: str, provider: Provider, usage: dict[str, Any]
    ) -> None:
        try:
            self.client().report_usage(
                preparation_id, report_id=report_id, provider=provider, usage=usage
            )
        except Exception as err:
            self.stats.add("usage_report_failures")
            logger.warning(
                "context-assembly: usage report of %s failed (%s%s)",
                preparation_id,
                type(err).__name__,
                _status_note(err),
            )
        else:
            self.stats.add("usage_reports")

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the usage reports under way are sent (or failed); ``False`` on timeout."""
        with self._lock:
            pending = set(self._reports)
        if not pending:
            return True
        _, not_done = wait_futures(pending, timeout=timeout)
        return not not_done

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Send the reports under way, stop the worker and close the clients the adapter made."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
        for owned in self._owned:
            if isinstance(owned, Client):
                owned.close()

    async def aclose(self) -> None:
        """:meth:`close` for async code: the worker is joined off the event loop."""
        await anyio.to_thread.run_sync(self.close)
        for owned in self._owned:
            if isinstance(owned, AsyncClient):
                await owned.aclose()


async def _resolved(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _status_note(err: Exception) -> str:
    if isinstance(err, APIStatusError):
        code = f" {err.code}" if err.code else ""
        return f", status {err.status_code}{code}, request {err.request_id}"
    return ""


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
        )

    @property
    def stats(self) -> AdapterStats:
        """Counters: calls prepared, calls that failed open, usage reports and their failures."""
        return self.preparer.stats

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for the usage reports under way; ``False`` if some are still going at ``timeout``."""
        return self.preparer.flush(timeout)

    def close(self) -> None:
        """Send the reports under way and close the clients the adapter made."""
        self.preparer.close()

    async def aclose(self) -> None:
        """:meth:`close` from async code."""
        await self.preparer.aclose()
