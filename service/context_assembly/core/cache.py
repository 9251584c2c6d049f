"""Cache plans: where provider cache directives go, and how a turn's prefix compares with the
previous turn's. Pure: figures and hashes in, plan and report out.

The service creates no cache, calls no provider and promises no hit. With a request's ``cache``
object it only says where a provider may cache (``plan``) and explains each turn against the one
before (``compare``); without it nothing here runs.

Breakpoints (``render: "anthropic"``; ``neutral`` shows the plan in the manifest only, each
breakpoint with the frame index of the message it ends, so that a runtime adapter can put the
marker in its own types)
    Anthropic reads a prompt as tools, then system, then messages, and caches nothing without a
    ``cache_control`` marker. The candidates, in that order:

    - ``tools``: after the last tool definition (when there are tools);
    - ``instructions``: after the leading system content (when there is any);
    - ``history``: after the last message of the stable prefix, the last message before the turn
      point (``core/layout.py``), when the prefix holds conversation messages; in ``transcript``
      the prefix is the previous turn's whole frame, so this marker reads what it wrote;
    - ``end`` (``transcript`` only): after the frame's last message, which the next turn's frame
      repeats. With the ``history`` marker on the previous turn's end, the read never depends on
      the provider's lookback over the blocks added since.

    Each is placed only where the tokens up to it reach the model's minimum cacheable length
    (``below_minimum`` otherwise; a model the provider caches nothing for has no minimum and
    places none), at most ``MAX_BREAKPOINTS`` (``limit``). In the ``legacy`` layout the leading
    system message carries the date line and the plugin views, which change from turn to turn,
    so only the tools marker can be stable: the other two are skipped as
    ``unstable_in_layout``. The token figures are the budget's (tools, and the frame's
    ``prefix_tokens``), counted with the request's tokenizer. ``cacheable_tokens`` is the figure
    of the last marker (0 when none is placed), the provider's own included (below).

    The tools' and the instructions' markers take ``instructions_ttl`` (else ``ttl``), the
    others ``ttl``: Anthropic takes 1-hour entries before 5-minute ones only, which the request's
    validation keeps (``CacheOptions.conflict``). ``automatic`` adds a top-level
    ``cache_control`` (Anthropic's automatic caching of the last block): it takes one of the
    four slots, and in ``transcript`` it is the ``end`` marker (skipped as ``automatic``,
    counted in ``cacheable_tokens``). ``diagnostics`` adds ``diagnostics.previous_message_id``,
    the previous turn's response id or ``None``.

OpenAI (``openai-chat``, ``openai-responses``)
    OpenAI caches a prompt's prefix by itself; the body gets ``prompt_cache_key`` (the request's
    string, or for ``"auto"`` an HMAC of tenant and scope under the server's secret: it reveals
    nothing of them, and no tenant can compute another's) and ``prompt_cache_retention`` when
    given (``neutral`` shows both in ``selection.cache`` instead, for an adapter to pass on).
    ``cacheable_tokens`` follows the provider rule over the stable prefix: from the model's
    minimum (1,024) up, in steps of 128 tokens. In ``legacy`` the leading message changes every
    turn, so it is 0. ``breakpoints`` is ignored.

OpenAI, models with explicit breakpoints (the registry's ``explicit_cache_breakpoints``: GPT-5.6
and later; ``neutral`` for such a model too)
    OpenAI writes an entry only at a breakpoint, at most four per request: its own, on the
    newest message that can carry one (``mode: "implicit"``, the default), and the
    ``prompt_cache_breakpoint`` markers of the plan; a later request reads only where its prefix
    ends exactly at one (no 128-token steps). The candidates are Anthropic's, as OpenAI takes
    them (``openai_candidates``): never on the tools (``not_markable``), the history marker on
    the last message of the prefix that takes one (not an assistant's), at most three beside
    OpenAI's own, which is the ``end`` marker of a ``transcript`` (skipped as ``automatic`` and
    counted); ``mode: "explicit"`` (``prompt_cache_options.mode``) places up to four, ``end``
    included. With ``retention`` no marker is sent (``retention``). ``diagnostics`` on the
    Responses render adds ``prompt_cache_options.comparison_response_id`` when the previous
    turn's response id is known. Without ``breakpoints`` only OpenAI's own marker counts.

``gemini`` ignores ``cache``'s directives; its ``cacheable_tokens`` is 0.

Digests (``PrefixDigests``): short hashes of each part of a turn's prefix, kept in the record
instead of any text: model and render target, layout, each tool definition (frame order), the
leading system content, and each history message sent. ``compare`` names the first part that
differs, in the order model, layout, tools, instructions, history.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Final, Literal

import orjson

from context_assembly.core.assemble import Assembly
from context_assembly.core.fingerprint import message_hashes
from context_assembly.core.render import CacheDirectives, openai_markable
from context_assembly.core.request import CacheOptions, PrepareRequest, Render, Scope
from context_assembly.core.result import (
    BreakpointAfter,
    CacheReport,
    CacheTtl,
    FirstChange,
    SkipReason,
)

Provider = Literal["openai", "anthropic", "google"]

MAX_BREAKPOINTS: Final = 4
"""Anthropic accepts at most four ``cache_control`` markers in one request."""

OPENAI_CACHE_STEP: Final = 128
"""OpenAI caches prefixes from the model's minimum up in steps of this many tokens (models
without explicit breakpoints)."""

OPENAI_BREAKPOINT_TTL: Final = "30m"
"""The lifetime OpenAI gives every breakpoint a request writes on models with explicit
breakpoints (``prompt_cache_options.ttl``'s default, which the service never sends)."""

# How long a provider keeps a cached prefix after its last use. OpenAI keeps in-memory
# prefixes five to ten minutes idle: the lower bound is taken.
ANTHROPIC_LIFETIME: Final[Mapping[CacheTtl, timedelta]] = {
    "5m": timedelta(minutes=5),
    "1h": timedelta(hours=1),
}
OPENAI_IN_MEMORY_LIFETIME: Final = timedelta(minutes=5)
OPENAI_EXTENDED_LIFETIME: Final = timedelta(hours=24)
# Models with explicit breakpoints: the ``30m`` ttl is a minimum lifetime; ``prompt_cache_retention``
# only states a maximum, so it does not lengthen it.
OPENAI_BREAKPOINT_LIFETIME: Final = timedelta(minutes=30)

_OPENAI: Final = frozenset({"openai-chat", "openai-responses"})
_MARKED: Final = frozenset({"anthropic", "neutral"})
DEFAULT_CACHE: Final = CacheOptions()
_PROVIDERS: Final[Mapping[str, Provider]] = {p: p for p in ("openai", "anthropic", "google")}


# --------------------------------------------------------------------------- plan


@dataclass(frozen=True, slots=True)
class CachePlan:
    """A turn's plan; ``breakpoints``, ``skipped`` and the directive objects in the wire form of
    ``CacheReport``'s."""

    breakpoints: tuple[dict[str, Any], ...]
    skipped: tuple[dict[str, Any], ...]
    cacheable_tokens: int
    directives: CacheDirectives
    key: str | None = None
    retention: str | None = None
    prompt_cache_options: dict[str, str] | None = None
    cache_control: dict[str, str] | None = None
    diagnostics: dict[str, str | None] | None = None


@dataclass(frozen=True, slots=True)
class Candidate:
    """A place a marker may go: ``tokens`` up to and including it, ``message`` the frame index
    of the message it ends (``None`` for the tools marker); ``markable`` is false where the
    provider takes no marker (OpenAI: tool definitions, assistant messages)."""

    after: BreakpointAfter
    tokens: int
    message: int | None
    markable: bool = True


def candidates(assembly: Assembly) -> list[Candidate]:
    """The marker candidates of an assembled frame, in prompt order (see the module doc)."""
    placed = assembly.placed
    budget = assembly.budget
    found: list[Candidate] = []
    if placed.tools:
        found.append(Candidate("tools", budget.tools_tokens, None))
    # The prefix is the leading message plus the conversation before the turn point.
    leading = 1 if placed.leading else 0
    if placed.leading:
        found.append(Candidate("instructions", assembly.leading_tokens, 0))
    if placed.prefix_len > leading:
        found.append(Candidate("history", assembly.prefix_tokens, placed.prefix_len - 1))
    last = len(placed.messages) - 1
    if assembly.selection.layout == "transcript" and last >= max(placed.prefix_len, leading):
        # The whole frame: the next turn's frame begins with it.
        found.append(Candidate("end", assembly.budget.total_input_tokens, last))
    return found


def openai_candidates(assembly: Assembly, render: Render) -> list[Candidate]:
    """The candidates of ``candidates`` as OpenAI takes them (``render``: the body's shape): the
    tools are never markable; the history marker goes on the last message of the prefix that
    takes one (``openai_markable``: not an assistant message), with the tokens up to it; the
    instructions and end markers only where their message takes one."""
    messages = assembly.placed.messages
    counts = assembly.prefix_counts
    found: list[Candidate] = []
    for candidate in candidates(assembly):
        if candidate.message is None:
            found.append(replace(candidate, markable=False))
            continue
        if candidate.after != "history" or len(counts) <= candidate.message:
            found.append(
                replace(candidate, markable=openai_markable(messages[candidate.message], render))
            )
            continue
        first = 1 if assembly.placed.leading else 0
        index, tokens = candidate.message, candidate.tokens
        while index >= first and not openai_markable(messages[index], render):
            tokens -= counts[index]
            index -= 1
        if index < first:
            found.append(replace(candidate, markable=False))
        else:
            found.append(Candidate("history", tokens, index))
    return found


def plan_breakpoints(
    found: Sequence[Candidate],
    *,
    legacy: bool,
    minimum: int | None,
    limit: int = MAX_BREAKPOINTS,
    automatic: bool = False,
    withheld: SkipReason | None = None,
) -> tuple[list[Candidate], list[tuple[Candidate, SkipReason]]]:
    """The candidates that get a marker, and the others with the reason they do not.

    ``limit``: the markers the plan may place (the provider's four, less one its own marker
    takes). ``automatic``: the provider's own marker ends the frame, so the ``end`` candidate is
    its (skipped as ``automatic`` where it reaches the minimum). ``withheld``: a reason every
    marker the plan would place is left out for (``retention``)."""
    placed: list[Candidate] = []
    skipped: list[tuple[Candidate, SkipReason]] = []
    for candidate in found:
        reason: SkipReason | None = None
        if legacy and candidate.after != "tools":
            reason = "unstable_in_layout"
        elif not candidate.markable:
            reason = "not_markable"
        elif minimum is None or candidate.tokens < minimum:
            reason = "below_minimum"
        elif automatic and candidate.after == "end":
            reason = "automatic"
        elif withheld is not None:
            reason = withheld
        elif len(placed) >= limit:
            reason = "limit"
        if reason is None:
            placed.append(candidate)
        else:
            skipped.append((candidate, reason))
    return placed, skipped


def openai_cacheable(tokens: int, minimum: int | None) -> int:
    """The part of a ``tokens``-long stable prefix OpenAI caches: from ``minimum`` up, in
    ``OPENAI_CACHE_STEP`` steps; 0 below the minimum or when the model caches nothing."""
    if minimum is None or tokens < minimum:
        return 0
    return minimum + (tokens - minimum) // OPENAI_CACHE_STEP * OPENAI_CACHE_STEP


def prompt_cache_key(key: str, tenant: str, scope: Scope, secret: bytes) -> str:
    """The ``prompt_cache_key`` for a request's ``cache.key``: the string as given, or for
    ``"auto"`` an HMAC-SHA256 of tenant and scope under the server's ``secret`` (the same for
    every turn of one scope, on every replica sharing the secret)."""
    if key != "auto":
        return key
    raw = orjson.dumps([tenant, scope.model_dump(mode="json")], option=orjson.OPT_SORT_KEYS)
    return "ca-" + hmac.new(secret, raw, hashlib.sha256).hexdigest()[:32]


def openai_explicit(render: Render, provider: Provider | None, explicit: bool) -> bool:
    """Whether OpenAI's explicit-breakpoint rules apply: an OpenAI render, or ``neutral`` for an
    OpenAI model, and a model with ``explicit_cache_breakpoints`` (``explicit``)."""
    return explicit and (render in _OPENAI or (render == "neutral" and provider == "openai"))


def _chosen(
    options: CacheOptions,
    placed: list[Candidate],
    skipped: list[tuple[Candidate, SkipReason]],
) -> tuple[list[Candidate], list[tuple[Candidate, SkipReason]], int]:
    """What a plan reports of ``plan_breakpoints``' answer: without ``breakpoints`` no marker of
    the plan's and only the provider's own (``automatic``); and the cacheable tokens, up to the
    last marker, the provider's own included."""
    if not options.breakpoints:
        placed, skipped = [], [(c, r) for c, r in skipped if r == "automatic"]
    ends = [c.tokens for c in placed] + [c.tokens for c, r in skipped if r == "automatic"]
    return placed, skipped, max(ends, default=0)


def _reasons(skipped: list[tuple[Candidate, SkipReason]]) -> tuple[dict[str, Any], ...]:
    return tuple({"after": c.after, "reason": reason} for c, reason in skipped)


def _openai_explicit_plan(
    options: CacheOptions,
    assembly: Assembly,
    *,
    render: Render,
    legacy: bool,
    minimum: int | None,
    key: str | None,
    previous_response_id: str | None,
) -> CachePlan:
    """The plan on a model with OpenAI's explicit breakpoints (rules in the module doc)."""
    implicit = options.mode == "implicit"
    placed, skipped, cacheable = _chosen(
        options,
        *plan_breakpoints(
            openai_candidates(assembly, render),
            legacy=legacy,
            minimum=minimum,
            limit=MAX_BREAKPOINTS - implicit,
            automatic=implicit,
            withheld="retention" if options.retention is not None else None,
        ),
    )
    cache_options: dict[str, str] = {}
    if not implicit:
        cache_options["mode"] = "explicit"
    compared = None
    if options.diagnostics and render in ("openai-responses", "neutral"):
        compared = previous_response_id
    if compared is not None:
        cache_options["comparison_response_id"] = compared
    directives = CacheDirectives()
    if render in _OPENAI:
        directives = CacheDirectives(
            messages=tuple(c.message for c in placed if c.message is not None),
            key=key,
            retention=options.retention,
            mode=None if implicit else "explicit",
            previous_response_id=compared,
        )
    return CachePlan(
        tuple(
            {
                "after": c.after,
                "tokens": c.tokens,
                "ttl": OPENAI_BREAKPOINT_TTL,
                "message": c.message,
            }
            for c in placed
        ),
        _reasons(skipped),
        cacheable,
        directives,
        key,
        options.retention,
        prompt_cache_options=cache_options or None,
    )


def plan(
    options: CacheOptions,
    assembly: Assembly,
    *,
    render: Render,
    legacy: bool,
    minimum: int | None,
    tenant: str,
    scope: Scope,
    key_secret: bytes,
    provider: Provider | None = None,
    explicit: bool = False,
    previous_response_id: str | None = None,
) -> CachePlan:
    """The cache plan of one assembled turn for ``render`` (rules in the module doc).

    ``minimum`` is the model's minimum cacheable length for the target provider
    (``ModelRegistry.min_cacheable_prefix``); ``None`` when the provider caches nothing for it.
    ``provider``: the provider whose rules apply (``provider_of``); ``explicit``: the model has
    OpenAI's explicit breakpoints; ``previous_response_id``: the previous turn's provider
    response id, named with ``cache.diagnostics``.
    """
    key = (
        prompt_cache_key(options.key, tenant, scope, key_secret)
        if options.key is not None
        else None
    )
    if openai_explicit(render, provider, explicit):
        return _openai_explicit_plan(
            options,
            assembly,
            render=render,
            legacy=legacy,
            minimum=minimum,
            key=key,
            previous_response_id=previous_response_id,
        )
    if render in _OPENAI:
        cacheable = 0 if legacy else openai_cacheable(assembly.prefix_tokens, minimum)
        directives = CacheDirectives(key=key, retention=options.retention)
        return CachePlan((), (), cacheable, directives, key, options.retention)
    # ``neutral`` shows the OpenAI options too: an adapter passes them on in its own types.
    shown = (key, options.retention) if render == "neutral" else (None, None)
    if render not in _MARKED:
        return CachePlan((), (), 0, CacheDirectives(), *shown)
    found = candidates(assembly) if options.breakpoints or options.automatic else []
    placed, skipped, cacheable = _chosen(
        options,
        *plan_breakpoints(
            found,
            legacy=legacy,
            minimum=minimum,
            limit=MAX_BREAKPOINTS - options.automatic,
            automatic=options.automatic,
        ),
    )
    ttls = [_anthropic_ttl(options, c) for c in placed]
    breakpoints = tuple(
        {"after": c.after, "tokens": c.tokens, "ttl": ttl, "message": c.message}
        for c, ttl in zip(placed, ttls, strict=True)
    )
    directives = CacheDirectives()
    if render == "anthropic":
        marked = [
            (c.message, ttl) for c, ttl in zip(placed, ttls, strict=True) if c.message is not None
        ]
        directives = CacheDirectives(
            ttl=options.ttl,
            tools=any(c.message is None for c in placed),
            messages=tuple(message for message, _ in marked),
            tools_ttl=options.instructions_ttl,
            message_ttls=tuple(ttl for _, ttl in marked),
            automatic=options.automatic,
            diagnostics=options.diagnostics,
            previous_response_id=previous_response_id if options.diagnostics else None,
        )
    return CachePlan(
        breakpoints,
        _reasons(skipped),
        cacheable,
        directives,
        *shown,
        **_anthropic_extras(options, render, provider, previous_response_id),
    )


def _anthropic_ttl(options: CacheOptions, candidate: Candidate) -> CacheTtl:
    """A marker's lifetime: ``instructions_ttl`` for the tools and the instructions (which come
    first: a 1-hour marker never follows a 5-minute one), ``ttl`` for the others."""
    if candidate.after in ("tools", "instructions") and options.instructions_ttl is not None:
        return options.instructions_ttl
    return options.ttl


def _anthropic_extras(
    options: CacheOptions, render: Render, provider: Provider | None, previous: str | None
) -> dict[str, Any]:
    """The top-level ``cache_control`` and ``diagnostics`` a plan reports (``anthropic``, and
    ``neutral`` for an adapter to pass on; ``diagnostics`` there only for an Anthropic model)."""
    if render not in _MARKED:
        return {}
    extras: dict[str, Any] = {}
    if options.automatic:
        control = {"type": "ephemeral"}
        if options.ttl == "1h":
            control["ttl"] = "1h"
        extras["cache_control"] = control
    if options.diagnostics and (render == "anthropic" or provider == "anthropic"):
        extras["diagnostics"] = {"previous_message_id": previous}
    return extras


# --------------------------------------------------------------------------- digests


def _short(value: Any) -> str:
    """A short hash of ``value``'s canonical JSON (64 bits: enough to tell two turns apart)."""
    return hashlib.blake2b(
        orjson.dumps(value, option=orjson.OPT_SORT_KEYS), digest_size=8
    ).hexdigest()


@dataclass(frozen=True, slots=True)
class PrefixDigests:
    """Hashes of the parts of a turn's prefix (no text): what a record keeps for ``compare``."""

    model: str
    layout: str
    tools: tuple[str, ...]
    instructions: str
    history: tuple[str, ...]


def prefix_digests(
    assembly: Assembly,
    *,
    model: str,
    render: Render,
    layout: str,
    history_digests: Sequence[str] | None = None,
) -> PrefixDigests:
    """The digests of ``assembly``'s prefix.

    A tool is hashed as its JSON in field order (one serialiser call, no sorting): a digest is
    only ever compared with one made the same way.
    ``history_digests``: the digests of the history messages sent (``message_hashes`` of
    ``assembly.history``), when the caller has them already; a record's ``history_hashes``
    without the ``budget.history_dropped_messages`` first ones are those.
    """
    history = message_hashes(assembly.history) if history_digests is None else history_digests
    return PrefixDigests(
        model=_short([model, render]),
        layout=_short(layout),
        tools=tuple(
            hashlib.blake2b(tool.__pydantic_serializer__.to_json(tool), digest_size=8).hexdigest()
            for tool in assembly.placed.tools
        ),
        instructions=_short(assembly.placed.leading or ""),
        history=tuple(history),
    )


def _first_difference(previous: tuple[str, ...], current: tuple[str, ...]) -> int | None:
    """The first index where the lists differ (``None`` when they are equal)."""
    common = min(len(previous), len(current))
    if previous[:common] == current[:common]:
        return None if len(previous) == len(current) else common
    return next(i for i in range(common) if previous[i] != current[i])


def compare(
    previous: PrefixDigests | None, current: PrefixDigests
) -> tuple[bool | None, FirstChange | None]:
    """``(prefix_kept, first_change)``: whether the previous turn's prefix starts this one and,
    when not, the first part that differs. ``(None, None)`` without a previous turn.

    The history may grow (the previous history followed by new messages keeps the prefix);
    every other part must be equal.
    """
    if previous is None:
        return None, None
    for part in ("model", "layout"):
        if getattr(previous, part) != getattr(current, part):
            return False, FirstChange(part=part, index=None)
    tools = _first_difference(previous.tools, current.tools)
    if tools is not None:
        return False, FirstChange(part="tools", index=tools)
    if previous.instructions != current.instructions:
        return False, FirstChange(part="instructions", index=None)
    history = _first_difference(previous.history, current.history)
    if history is not None and history < len(previous.history):
        return False, FirstChange(part="history", index=history)
    return True, None


def report(
    cache_plan: CachePlan,
    previous_preparation_id: str | None,
    comparison: tuple[bool | None, FirstChange | None],
) -> CacheReport:
    """``selection.cache`` of a turn (validated in one pydantic-core pass)."""
    prefix_kept, first_change = comparison
    return CacheReport.model_validate(
        {
            "previous_preparation_id": previous_preparation_id,
            "prefix_kept": prefix_kept,
            "first_change": first_change,
            "cacheable_tokens": cache_plan.cacheable_tokens,
            "breakpoints": cache_plan.breakpoints,
            "skipped": cache_plan.skipped,
            "prompt_cache_key": cache_plan.key,
            "prompt_cache_retention": cache_plan.retention,
            "prompt_cache_options": cache_plan.prompt_cache_options,
            "cache_control": cache_plan.cache_control,
            "diagnostics": cache_plan.diagnostics,
        }
    )


# --------------------------------------------------------------------------- one turn


@dataclass(frozen=True, slots=True)
class CacheTurn:
    """What a request's ``cache`` gives one turn: the body's directives, ``selection.cache``,
    and the digests of its prefix (to keep in the record for the next turn)."""

    directives: CacheDirectives
    report: CacheReport
    digests: PrefixDigests


def provider_of(render: Render, model_provider: str) -> Provider | None:
    """The provider whose cache rules apply: the render target's, else the model's."""
    if render == "anthropic":
        return "anthropic"
    if render in _OPENAI:
        return "openai"
    return _PROVIDERS.get(model_provider)


def turn(
    request: PrepareRequest,
    assembly: Assembly,
    *,
    model: str,
    minimum: int | None,
    tenant: str,
    previous_preparation_id: str | None,
    previous: PrefixDigests | None,
    key_secret: bytes,
    history_digests: Sequence[str] | None = None,
    provider: Provider | None = None,
    explicit: bool = False,
    previous_response_id: str | None = None,
) -> CacheTurn:
    """The cache handling of one assembled turn of ``request``.

    A request without ``cache`` is planned with the defaults (no breakpoints, no key), so that
    its record can keep the digests and figures too; its answer carries none of it
    (``engine.to_response``). ``model`` is the model assembled for (the routed one) and
    ``minimum`` its minimum cacheable length for the provider of the render target
    (``engine.cache_minimum``). ``previous`` are the digests the previous turn's record kept
    (``None``: a first turn, or a record without them); ``history_digests`` as for
    ``prefix_digests``. ``provider``, ``explicit`` and ``previous_response_id`` as for ``plan``
    (``engine.cache_model``; ``preparations/turns.previous_response_id``).
    """
    cache_plan = plan(
        request.cache if request.cache is not None else DEFAULT_CACHE,
        assembly,
        render=request.render,
        legacy=request.options.layout == "legacy",
        minimum=minimum,
        tenant=tenant,
        scope=request.scope,
        key_secret=key_secret,
        provider=provider,
        explicit=explicit,
        previous_response_id=previous_response_id,
    )
    digests = prefix_digests(
        assembly,
        model=model,
        render=request.render,
        layout=request.options.layout,
        history_digests=history_digests,
    )
    return CacheTurn(
        cache_plan.directives,
        report(cache_plan, previous_preparation_id, compare(previous, digests)),
        digests,
    )


# --------------------------------------------------------------------------- usage


def cache_lifetime(
    render: Render, options: CacheOptions, *, explicit: bool = False
) -> timedelta | None:
    """How long the provider keeps a cached prefix after its last use (``None``: no cache the
    service models, as for ``gemini``). ``explicit``: OpenAI's explicit-breakpoint rules apply
    (``openai_explicit``), whose entries live at least 30 minutes."""
    if explicit:
        return OPENAI_BREAKPOINT_LIFETIME
    if render in _OPENAI:
        return OPENAI_EXTENDED_LIFETIME if options.retention == "24h" else OPENAI_IN_MEMORY_LIFETIME
    if render in _MARKED:
        return ANTHROPIC_LIFETIME[options.ttl]
    return None


def long_lifetime(render: Render, options: CacheOptions) -> timedelta | None:
    """The lifetime of the markers that outlive the others: Anthropic's 1-hour markers on the
    tools and instructions (``instructions_ttl``) beside 5-minute ones; ``None`` otherwise."""
    if render in _MARKED and options.instructions_ttl == "1h" and options.ttl == "5m":
        return ANTHROPIC_LIFETIME["1h"]
    return None


def long_lived_tokens(breakpoints: Sequence[Mapping[str, Any]]) -> int:
    """The tokens up to the last 1-hour marker of a plan's ``breakpoints`` (wire form), 0 when
    there is none."""
    return max((int(b["tokens"]) for b in breakpoints if b.get("ttl") == "1h"), default=0)


def expected_cached_tokens(
    *,
    prefix_kept: bool | None,
    cacheable_tokens: int,
    previous_cacheable_tokens: int,
    since_previous: timedelta,
    lifetime: timedelta | None,
    long_lived: tuple[int, int] = (0, 0),
    long_lifetime: timedelta | None = None,
) -> int:
    """The cached input tokens a provider can be expected to report for this turn's call.

    What this turn can read from a cache is what the previous turn wrote: the smaller of the two
    turns' ``cacheable_tokens`` when the previous prefix was kept and the previous turn is at most
    ``lifetime`` old (``since_previous``), else 0. With markers that outlive the others
    (``long_lifetime``, ``cache.long_lifetime``), a previous turn older than ``lifetime`` but
    within ``long_lifetime`` gives the smaller of the two turns' figures up to their last such
    marker (``long_lived``: this turn's and the previous turn's, ``long_lived_tokens``).
    """
    if not prefix_kept or lifetime is None:
        return 0
    if since_previous <= lifetime:
        return min(cacheable_tokens, previous_cacheable_tokens)
    if long_lifetime is not None and since_previous <= long_lifetime:
        return min(long_lived)
    return 0
