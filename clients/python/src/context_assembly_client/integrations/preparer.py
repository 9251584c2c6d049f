"""The loop every runtime adapter runs around one model call, in one place.

A runtime adapter (LangChain, Pydantic AI, the OpenAI Agents SDK) only maps between its runtime's
types and the service's neutral shape; everything else happens here:

1. **The request.** The runtime's call, as neutral messages and tools (:class:`RuntimeCall`),
   becomes a prepare request: the system prompt is ``instructions``, the tool definitions are
   ``tools``, and the messages are split into ``history`` and ``input`` by :func:`split_turn`:
   ``input`` is the latest user turn (the run of consecutive user messages that holds the last
   one) and every message after it, tool calls and their results included; ``history`` is
   everything before it. A call without any user message is all ``input``. The rest of the
   request (budgets, plugins, registered contributors, ``assembly``, ``cache``, ``scope``) is the
   application's ``template``; inline blocks come from its ``contributions`` callable, after the
   template's own. ``render`` is always ``"neutral"``. ``model`` is the model the runtime is
   about to call (:attr:`RuntimeCall.model`, the runtime's name for it) unless the template names
   one (or ``models``); ``assembly.layout`` is ``"transcript"`` unless the template names one;
   ``scope`` is ``{"task_id": <the runtime's conversation id>}`` when the template has none and
   the runtime offers one (:attr:`RuntimeCall.conversation`).
2. **Prepare** with the public client API (:meth:`Client.prepare` / :meth:`AsyncClient.prepare`)
   under the adapter's deadline (``timeout`` seconds: the whole call on the async path, each phase
   of it on the sync path, where nothing can interrupt a blocking read).
3. **The frame, aligned** (:func:`align`): each frame message is matched, in order, with the
   neutral message the adapter sent, so that the runtime gets its own objects back (images,
   files, reasoning blocks, ids and metadata included); the messages the service added (leading
   system message, per-turn developer messages, data messages, earlier turns' ones included in a
   ``transcript``) are marked as such for the adapter to build in its runtime's types. The
   history the service dropped under ``history_policy: drop_oldest`` is the only thing missing,
   as ``budget.history_dropped_messages`` says. Tools come back as the runtime's tool objects in
   frame order, the cache plan of ``selection.cache`` as :class:`Breakpoint` values and the
   OpenAI ``prompt_cache_key`` / ``prompt_cache_retention``, and the output limit the budget
   reserved (``response_reserve`` plus ``reasoning_reserve_tokens``, at most the model's maximum
   output of ``GET /v1/models``) as :attr:`Prepared.output_limit`.
4. **Compaction** (docs/integrations.md#compaction). Every answer's ``selection.compaction`` is
   :attr:`Preparer.last_compaction` and goes to ``on_compaction`` when it decided to act.
   ``assembly.compaction.mode: "native"`` needs a provider render, which an adapter cannot ask
   for: the adapter asks the service to decide as in ``report`` and writes the provider's own
   directive (:func:`native_directive`) into the call for a model class that carries it
   (:attr:`RuntimeCall.native_compaction`); for any other class it warns once and counts
   ``stats.native_compaction_skipped``. The history the service leaves out (before a provider's
   compaction item, folded into a summary) and the tool results it clears are matched by
   :func:`align` like dropped history and rewritten messages.
5. **Usage** (:meth:`Preparer.report_usage`) goes to the service from one daemon thread with a
   client of its own (``REPORT_TIMEOUT`` seconds per phase, no retry), out of a queue of at most
   ``REPORT_QUEUE`` reports (a full queue drops its oldest report, counted in
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
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import logging
import threading
import time
import traceback
import uuid
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias, TypeVar

import anyio

from context_assembly_client import APIStatusError, AsyncClient, Client, ContextAssemblyError
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

REPORT_TIMEOUT: Final = 2.0
"""Seconds a usage report may take per phase (connect, send, read); reports are not retried."""

REPORT_QUEUE: Final = 256
"""Usage reports waiting to be sent, at most; a full queue drops its oldest one (counted)."""

CLOSE_WAIT: Final = 5.0
"""Seconds :meth:`Preparer.close` waits for the queued reports before dropping the rest."""

EXIT_WAIT: Final = 2.0
"""Seconds the interpreter's exit waits for the queued reports of every adapter."""

_IDLE: Final = 30.0
"""Seconds the report thread waits for a report before it ends (a later report starts another)."""

DEFAULT_LAYOUT: Final = "transcript"
"""The layout an adapter asks for when the template's ``assembly`` names none."""

RESERVED_KEYS: Final = frozenset({"instructions", "history", "input", "tools"})
"""Request fields the adapter fills from the runtime's call; a template must not set them."""

ADDED_ROLES: Final = frozenset({"system", "developer", "user"})
"""Roles of the messages the service adds to a frame (leading system, per-turn developer, data)."""

NativeApi: TypeAlias = Literal["anthropic", "openai-responses"]
"""The provider compactions an adapter can write: those of the service's renders that have one."""

ANTHROPIC_COMPACTION_EDIT: Final = "compact_20260112"
ANTHROPIC_COMPACTION_BETA: Final = "compact-2026-01-12"
ANTHROPIC_MIN_THRESHOLD: Final = 50_000
"""Anthropic's compaction edit, the beta it needs and its least trigger, as the service's
``anthropic`` render writes them (docs/compaction.md#native)."""

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
    """A runtime's model call in the service's neutral shape.

    ``model`` is the runtime's name of the model it is about to call (the request's ``model``
    unless the template names one); ``conversation`` the runtime's id of the conversation, thread
    or run, when it offers one (the default ``scope``)."""

    instructions: str
    messages: Sequence[Carried]
    tools: Sequence[Carried] = ()
    model: str | None = None
    conversation: str | None = None
    native_compaction: NativeApi | None = None
    """The provider compaction the model's class can carry in its call (``None``: none)."""


@dataclass(frozen=True, slots=True)
class FrameMessage:
    """One frame message: its ``index`` in the frame, and the runtime object it came from
    (``origin``), or ``None`` for a message the service added (``neutral`` then says what).
    ``rewritten``: the service replaced the content of ``origin`` (a cleared tool result): the
    runtime sends ``neutral["content"]`` in its place."""

    index: int
    neutral: dict[str, Any]
    origin: Any | None
    rewritten: bool = False


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
    output_limit: int | None = None
    """The call's output limit: the budget's ``response_reserve`` plus its
    ``reasoning_reserve_tokens``, at most the model's maximum output (``None``: no reserve)."""
    compaction: CompactionReport | None = None
    """The compaction decision as the adapter presents it: ``selection.compaction``, with
    ``mode: "native"`` and the directive written (``native``) when the template asked for it."""
    native: NativeDirective | None = None
    """The provider's compaction to write into the call (``mode: "native"``, a class that has it)."""

    @property
    def preparation_id(self) -> str:
        return self.response.preparation_id

    def limit_within(self, *current: Any) -> int | None:
        """The output limit to set: :attr:`output_limit`, unless one of the ``current`` limits
        (the application's own settings, ``None`` when unset) is smaller; ``None`` when there is
        nothing to change."""
        if self.output_limit is None:
            return None
        set_already = [value for value in current if isinstance(value, int) and value > 0]
        if set_already and min(set_already) <= self.output_limit:
            return None
        return self.output_limit


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
    usage_reports_dropped: int = 0
    """Usage reports never sent: dropped from a full queue, or left when the adapter closed."""
    cache_markers_skipped: int = 0
    """Anthropic markers of a plan that the runtime's types, or the model's class, had no place
    for."""
    mapping_errors: int = 0
    """Failures of the adapter's own mapping (logged with where they happened; the call went on
    unchanged, or its usage was not reported)."""
    native_compaction_skipped: int = 0
    """Calls of ``mode: "native"`` whose model class has no place for the provider's compaction:
    they went out without it (warned once per adapter)."""
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


def is_compaction_item(part: Any) -> bool:
    """Whether a neutral part is a provider's compaction item (``native``, item type
    ``compaction``)."""
    return (
        isinstance(part, Mapping)
        and part.get("type") == "native"
        and isinstance(part.get("item"), Mapping)
        and part["item"].get("type") == "compaction"
    )


def _from_item(message: Mapping[str, Any]) -> dict[str, Any] | None:
    """``message`` from its latest compaction item on, as the service sends a history message
    that holds one (the provider ignores what precedes it); ``None`` when nothing is left out."""
    content = message.get("content")
    if not isinstance(content, list):
        return None
    found = [index for index, part in enumerate(content) if is_compaction_item(part)]
    if not found or found[-1] == 0:
        return None
    return _comparable({**message, "content": content[found[-1] :]})


def _rewritten(frame: Mapping[str, Any], sent: Mapping[str, Any]) -> bool:
    """Whether ``frame`` is the tool message ``sent`` with its content replaced (cleared)."""
    return (
        frame.get("role") == "tool"
        and sent.get("role") == "tool"
        and isinstance(frame.get("content"), str)
        and _comparable({**frame, "content": None}) == _comparable({**sent, "content": None})
    )


def history_skipped(response: PrepareResponse) -> range:
    """The history messages the frame does not hold: those before a provider's compaction item
    and those ``history_policy`` dropped (the oldest), or those a summary folded (from
    ``folded_from``: the summary itself is a message the service added, and the first one
    ``history_policy`` drops after it).

    Raises:
        IntegrationError: for a summary after leading system messages together with dropped
            history, which the adapters do not map back.
    """
    report = response.selection.compaction
    removed = response.budget.history_dropped_messages
    if report is None:
        return range(removed)
    removed += report.provider_item_dropped_messages
    folded = report.folded_messages
    if not folded:
        return range(removed)
    start = report.folded_from
    if start and removed:
        raise IntegrationError(
            "a summary after leading system messages with history dropped is not mapped back"
        )
    return range(start, start + folded + max(removed - 1, 0))


def align(
    frame_messages: Sequence[Mapping[str, Any]],
    history: Sequence[Carried],
    inputs: Sequence[Carried],
    dropped: int | range,
) -> list[FrameMessage]:
    """The frame's messages, each with the runtime object it came from (``None``: added).

    The service keeps history (less the ``dropped`` messages: a count of the oldest, or the range
    :func:`history_skipped` gives)
    and input in order and only adds system, developer and user messages around them, so one
    pass in order matches them. A history message that holds a provider's compaction item comes
    back from that item on (the origin is still the whole runtime object: the provider ignores
    the rest); a tool result the service cleared comes back ``rewritten``.

    Raises:
        IntegrationError: when the frame holds another message, or lacks one that was sent.
    """
    skipped = range(dropped) if isinstance(dropped, int) else dropped
    expected = [*history[: skipped.start], *history[skipped.stop :], *inputs]
    aligned: list[FrameMessage] = []
    cursor = 0
    for index, raw in enumerate(frame_messages):
        message = dict(raw)
        sent = expected[cursor].neutral if cursor < len(expected) else None
        if sent is not None and _comparable(message) in (_comparable(sent), _from_item(sent)):
            aligned.append(FrameMessage(index, message, expected[cursor].origin))
            cursor += 1
        elif sent is not None and _rewritten(message, sent):
            aligned.append(FrameMessage(index, message, expected[cursor].origin, rewritten=True))
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
    # Anthropic markers only: a ``30m`` breakpoint is OpenAI's ``prompt_cache_breakpoint``
    # (GPT-5.6 and later), which the runtimes here have no place for.
    breakpoints = [
        Breakpoint(point.after, point.ttl, getattr(point, "message", None))
        for point in cache.breakpoints
        if point.ttl != "30m"
    ]
    key = getattr(cache, "prompt_cache_key", None)
    retention = getattr(cache, "prompt_cache_retention", None)
    return breakpoints, key, retention


def native_directive(report: CompactionReport, api: NativeApi) -> NativeDirective:
    """The provider's compaction at the report's trigger, as the service's render for ``api``
    writes it (Anthropic: at least ``ANTHROPIC_MIN_THRESHOLD``, with its beta)."""
    if api == "anthropic":
        threshold = max(report.trigger_tokens, ANTHROPIC_MIN_THRESHOLD)
        return NativeDirective(
            parameter="context_management",
            threshold_tokens=threshold,
            beta=ANTHROPIC_COMPACTION_BETA,
        )
    return NativeDirective(
        parameter="context_management", threshold_tokens=report.trigger_tokens, beta=None
    )


def with_native(directive: NativeDirective, api: NativeApi, current: Any = None) -> Any:
    """The call's ``context_management`` with ``directive`` in it: ``current`` (the application's
    own, kept) plus the provider's compaction entry, unless ``current`` has one already."""
    if api == "anthropic":
        edit = {
            "type": ANTHROPIC_COMPACTION_EDIT,
            "trigger": {"type": "input_tokens", "value": directive.threshold_tokens},
        }
        config = dict(current) if isinstance(current, Mapping) else {}
        edits = list(config.get("edits") or [])
        if not any(isinstance(e, Mapping) and e.get("type") == edit["type"] for e in edits):
            edits.append(edit)
        return {**config, "edits": edits}
    entries = list(current) if isinstance(current, list) else []
    if not any(isinstance(e, Mapping) and e.get("type") == "compaction" for e in entries):
        entries.append({"type": "compaction", "compact_threshold": directive.threshold_tokens})
    return entries


def _reserve(response: PrepareResponse) -> int | None:
    budget = response.budget
    reserve = budget.response_reserve + budget.reasoning_reserve_tokens
    return reserve if reserve > 0 else None


def where(err: BaseException, limit: int = 8) -> str:
    """Where ``err`` was raised: the innermost ``limit`` frames of its traceback as
    ``module:line function``, innermost last; never the exception's message."""
    frames = [
        f"{frame.f_globals.get('__name__', '?')}:{line} {frame.f_code.co_name}"
        for frame, line in traceback.walk_tb(err.__traceback__)
    ]
    return " < ".join(reversed(frames[-limit:])) or "no traceback"


def is_mapping_bug(err: BaseException) -> bool:
    """An error of the adapter's own mapping, not of the service or the network: a frame that does
    not match what was sent (:class:`IntegrationError`), or any exception that is neither a client
    error nor the deadline."""
    if isinstance(err, IntegrationError):
        return True
    return not isinstance(err, ContextAssemblyError | TimeoutError)


# --------------------------------------------------------------------------- usage reports


@dataclass(frozen=True, slots=True)
class _Report:
    preparation_id: str
    report_id: str
    provider: Provider
    usage: dict[str, Any]
    response_id: str | None
    diagnostics: dict[str, Any] | None


class _ReportQueue:
    """A bounded queue of usage reports and the one daemon thread that sends them.

    The thread is a daemon: it never keeps the process alive. ``put`` drops the oldest queued
    report when the queue is full; ``close`` waits a bounded time, then drops what is left; the
    interpreter's exit waits at most ``EXIT_WAIT`` seconds for every open queue
    (:func:`_drain_at_exit`)."""

    def __init__(
        self, send: Callable[[_Report], None], drop: Callable[[int], None], limit: int
    ) -> None:
        self._send = send
        self._drop = drop
        self._limit = limit
        self._queue: deque[_Report] = deque()
        self._cond = threading.Condition()
        self._busy = False
        self._thread: threading.Thread | None = None

    def put(self, report: _Report) -> None:
        dropped = 0
        with self._cond:
            while len(self._queue) >= self._limit:
                self._queue.popleft()
                dropped += 1
            self._queue.append(report)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._work, name="context-assembly-usage", daemon=True
                )
                self._thread.start()
                _OPEN_QUEUES.add(self)
            self._cond.notify_all()
        if dropped:
            self._drop(dropped)

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                if not self._queue and self._thread is me:
                    self._cond.wait(_IDLE)
                if self._thread is not me:  # closed: the queue was dropped
                    return
                if not self._queue:  # idle: the thread ends, and a later put starts another
                    self._thread = None
                    _OPEN_QUEUES.discard(self)
                    return
                report = self._queue.popleft()
                self._busy = True
            try:
                self._send(report)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._queue) + int(self._busy)

    def wait(self, timeout: float | None) -> bool:
        """Wait until every queued report is sent (or failed); ``False`` at ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def close(self, timeout: float) -> bool:
        """Wait at most ``timeout`` for the queue, then drop what is left and stop the thread (a
        report under way finishes on its own, within its timeout). A later ``put`` starts over."""
        done = self.wait(timeout)
        with self._cond:
            left = len(self._queue)
            self._queue.clear()
            self._thread = None
            self._cond.notify_all()
        _OPEN_QUEUES.discard(self)
        if left:
            self._drop(left)
        return done


_OPEN_QUEUES: weakref.WeakSet[_ReportQueue] = weakref.WeakSet()


def _drain_at_exit() -> None:
    """At the interpreter's exit: give every open queue at most ``EXIT_WAIT`` seconds in all."""
    deadline = time.monotonic() + EXIT_WAIT
    for queue in list(_OPEN_QUEUES):
        queue.wait(max(0.0, deadline - time.monotonic()))


atexit.register(_drain_at_exit)


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
        self._max_output: dict[str, int | None] | None = None  # registry entry -> maximum
        self._reports = _ReportQueue(
            self._send_report,
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
            limit = self._limit(response, lambda: self.client().models(timeout=self.timeout))
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
            limit = self._limit(response, lambda: registry)
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
        entry = response.selection.model_entry
        if _reserve(response) is None or entry is None or self._max_output is not None:
            return None
        with anyio.move_on_after(self.timeout):
            try:
                return await self.aclient().models(timeout=self.timeout)
            except ContextAssemblyError as err:
                logger.debug("the model registry could not be read (%s)", type(err).__name__)
        return None

    def _limit(
        self, response: PrepareResponse, registry: Callable[[], ModelList | None]
    ) -> int | None:
        """The frame's output limit: the reserve, at most the model's maximum output. The registry
        is read once per adapter; when it cannot be read, the reserve stands alone."""
        reserve = _reserve(response)
        if reserve is None:
            return None
        entry = response.selection.model_entry
        if entry is None:
            return reserve
        if self._max_output is None:
            try:
                models = registry()
            except ContextAssemblyError as err:
                logger.debug("the model registry could not be read (%s)", type(err).__name__)
                return reserve
            if models is not None:
                self._max_output = {info.name: info.max_output_tokens for info in models.models}
        maximum = (self._max_output or {}).get(entry)
        return reserve if maximum is None else min(reserve, maximum)

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
        breakpoints, key, retention = _cache_plan(response)
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
            _status_note(err),
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
        report = _Report(
            prepared.preparation_id,
            report_id or response_id or f"adapter-{uuid.uuid4().hex}",
            provider,
            dict(usage),
            response_id or None,
            dict(diagnostics) if diagnostics else None,
        )
        self._reports.put(report)

    def _send_report(self, report: _Report) -> None:
        try:
            self._report_client().report_usage(
                report.preparation_id,
                report_id=report.report_id,
                provider=report.provider,
                usage=report.usage,
                response_id=report.response_id,
                diagnostics=report.diagnostics,
            )
        except Exception as err:
            self.stats.add("usage_report_failures")
            logger.warning(
                "context-assembly: usage report of %s failed (%s%s)",
                report.preparation_id,
                type(err).__name__,
                _status_note(err),
            )
        else:
            self.stats.add("usage_reports")

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
